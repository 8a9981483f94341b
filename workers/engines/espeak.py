"""espeak-ng through ctypes: every language espeak knows (Mandarin, Cantonese, English...), robotic.

The shared library and its data come from the PyPI package ``espeakng-loader``; nothing is read
from the system's espeak installation.

**One synthesis per process at a time.** libespeak-ng keeps its voice, its parameters and its
audio callback in process-wide globals, so every use of the library holds :data:`_LOCK` from
choosing the voice to the end of ``espeak_Synth``. That costs little: a line of Chinese
synthesizes in about 2 ms. Any number of :class:`EspeakEngine` instances may live in one process;
they take turns.

Streaming: ``espeak_Synth`` is blocking and hands audio to a C callback about every 100 ms of
audio. :meth:`EspeakEngine.stream` runs it in a short-lived producer thread and yields each
buffer as the callback delivers it. The producer never waits for the consumer (so a slow reader
can never hold the process-wide lock); its queue is bounded instead by ``max_seconds`` of audio
per utterance, past which the synthesis is aborted with :class:`EngineError`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import re
import threading
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from voxroom.errors import EngineError
from workers.engines.base import Pcm, SynthesisRequest
from workers.engines.marks import Anchor, AnchoredStream, WordMark

log = logging.getLogger("voxroom.engine.espeak")

_LOCK = threading.Lock()
"""Guards all of libespeak-ng's global state: initialisation, voice, parameters, callback sink."""

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report a missing data directory instead of calling exit()
_CHARS_AUTO = 0  # UTF-8 when valid; no espeakSSML flag, so text is never SSML
_PHONEMES = 0x100  # espeakPHONEMES: ``[[...]]`` holds phoneme mnemonics (the lexicon's; users' are refused)
_POS_CHARACTER = 1
_RATE = 1
_PITCH = 3
_EE_OK = 0
_BUFFER_MS = 100  # one callback per ~100 ms of audio: the chunk size the stream yields

DEFAULT_RATE = 175  # words per minute, espeakRATE_NORMAL
DEFAULT_PITCH = 50  # 0-100, espeak's neutral pitch
_VOICE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}(\+[A-Za-z0-9_-]{1,20})?$")

_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1


class _Event(ctypes.Structure):
    """``espeak_EVENT`` from speak_lib.h. ``text_position`` counts characters (code points) from 1;
    ``sample`` is the event's sample index in the synthesis's audio."""

    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_void_p)]


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                  ctypes.POINTER(_Event))


class _Sink:
    """Where the callback puts the current synthesis's audio; one per utterance."""

    def __init__(self, cancel: threading.Event, max_samples: int) -> None:
        self.out: queue.SimpleQueue[Pcm | list[Anchor] | EngineError | None] = queue.SimpleQueue()
        self.cancel = cancel
        self.stop = threading.Event()
        self.max_samples = max_samples
        self.samples = 0

    def deliver(self, wav: Any, count: int, events: Any) -> int:
        """Return 0 to go on, 1 to make espeak abort the synthesis. The word events of a buffer
        (positions in it or at its end) go out just before the buffer."""
        if self.cancel.is_set() or self.stop.is_set():
            return 1
        words: list[Anchor] = []
        i = 0
        while events and events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            if event.type == _EVENT_WORD:
                words.append(Anchor(event.text_position - 1, event.length, event.sample))
            i += 1
        if words:
            self.out.put(words)
        if not wav or count <= 0:
            return 0
        self.samples += count
        if self.samples > self.max_samples:
            self.out.put(EngineError(
                f"espeak utterance longer than {self.max_samples} samples; split the text"))
            return 1
        pcm = np.ctypeslib.as_array(wav, shape=(count,)).astype(np.float32) / 32768.0
        self.out.put(pcm)
        return 0


class _Library:
    """libespeak-ng, initialised once per process. Use only while holding :data:`_LOCK`."""

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError:
            raise EngineError("espeak engine needs the 'espeakng-loader' package "
                              "(pip install 'voxroom[offline]')") from None
        try:
            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            data = espeakng_loader.get_data_path()
        except (OSError, RuntimeError) as exc:
            raise EngineError(f"cannot load libespeak-ng: {exc}") from None
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                     ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, os.fsencode(data),
                                     _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise EngineError(f"espeak_Initialize failed ({rate}) with data at {data}")
        self.lib = lib
        self.sample_rate = int(rate)
        self.sink: _Sink | None = None
        # Kept on the object: ctypes does not keep the callback alive, and espeak calls it forever.
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        log.info("libespeak-ng loaded: %s Hz, data %s", self.sample_rate, data)

    def _on_audio(self, wav: Any, count: int, events: Any) -> int:
        sink = self.sink
        if sink is None:
            return 1
        try:
            return sink.deliver(wav, count, events)
        except Exception as exc:  # an exception must not cross into C: abort and report it
            sink.out.put(EngineError(f"espeak callback failed: {exc!r}"))
            return 1

    def synthesize(self, text: bytes, voice: str, rate: int, pitch: int, sink: _Sink) -> None:
        """Run one synthesis to its end; audio and errors go to ``sink``. Caller holds the lock."""
        if self.lib.espeak_SetVoiceByName(voice.encode("ascii")) != _EE_OK:
            raise EngineError(f"unknown espeak voice {voice!r}")
        # Set every time: another engine instance may have changed these process-wide values.
        self.lib.espeak_SetParameter(_RATE, rate, 0)
        self.lib.espeak_SetParameter(_PITCH, pitch, 0)
        self.sink = sink
        try:
            rc = self.lib.espeak_Synth(text, len(text), 0, _POS_CHARACTER, 0, _CHARS_AUTO | _PHONEMES,
                                         None, None)
        finally:
            self.sink = None
        if rc != _EE_OK and not (sink.cancel.is_set() or sink.stop.is_set()):
            raise EngineError(f"espeak_Synth failed ({rc})")


_library: _Library | None = None


def _get_library() -> _Library:
    global _library
    with _LOCK:
        if _library is None:
            _library = _Library()
        return _library


def _int_param(params: Any, key: str, default: int, low: int, high: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise EngineError(f"espeak param {key}={value!r} must be a number in [{low}, {high}]")
    return int(value)


class EspeakEngine:
    """The espeak-ng engine. Voice: the catalog's ``params.voice`` (``cmn``, ``yue``, ``en-us``...).

    Optional params: ``rate`` (words per minute, 80-450) and ``pitch`` (0-99).
    """

    name = "espeak"
    max_batch = 1

    def __init__(self, *, max_seconds: float = 300.0, join_timeout_s: float = 5.0) -> None:
        self.sample_rate = 22_050  # espeak-ng's fixed rate; confirmed by load()
        self.max_seconds = max_seconds
        self.join_timeout_s = join_timeout_s
        self._library: _Library | None = None

    def load(self, device: str) -> None:
        """Load libespeak-ng (once per process). espeak runs on the CPU whatever ``device`` says."""
        if device != "cpu":
            log.info("espeak runs on the CPU; ignoring device %s", device)
        self._library = _get_library()
        self.sample_rate = self._library.sample_rate

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """Yield ~100 ms chunks as espeak produces them. Raises :class:`EngineError` for an
        unknown voice or bad params (on the first ``next()``, like any generator)."""
        for item in self._synthesize(request, cancel):
            if isinstance(item, np.ndarray):
                yield item

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`'s audio with word marks from espeak's own word events (the sample at
        which it starts each word). A chunk waits only until the marks of the words that start in
        it are final (the next word's event came): espeak runs hundreds of times faster than real
        time, so that costs well under a millisecond."""
        timeline = AnchoredStream(request.text, self.sample_rate)
        items = self._synthesize(request, cancel, wait=False)
        try:
            for item in items:
                if item is None:
                    for out in timeline.ready():
                        if cancel.is_set():
                            return
                        yield out
                elif isinstance(item, list):
                    timeline.anchors(item)
                else:
                    timeline.audio(item)
            for out in timeline.finish():
                if cancel.is_set():
                    return
                yield out
        finally:
            items.close()

    def _synthesize(self, request: SynthesisRequest, cancel: threading.Event, *,
                    wait: bool = True) -> Generator[Pcm | list[Anchor] | None, None, None]:
        """Audio chunks and, before each, the word events of that chunk. ``wait=False``: yield
        ``None`` whenever nothing more is at hand yet, before blocking for it."""
        library = self._library
        if library is None:
            raise EngineError("EspeakEngine.stream() called before load()")
        voice = request.voice.params.get("voice")
        if not isinstance(voice, str) or not _VOICE_NAME.match(voice):
            raise EngineError(f"voice {request.voice.id!r}: params.voice={voice!r} is not an espeak voice")
        rate = _int_param(request.voice.params, "rate", DEFAULT_RATE, 80, 450)
        pitch = _int_param(request.voice.params, "pitch", DEFAULT_PITCH, 0, 99)
        text = request.text.replace("\0", " ").encode("utf-8") + b"\0"
        sink = _Sink(cancel, max_samples=int(self.max_seconds * library.sample_rate))

        def produce() -> None:
            try:
                with _LOCK:
                    library.synthesize(text, voice, rate, pitch, sink)
            except EngineError as exc:
                sink.out.put(exc)
            finally:
                sink.out.put(None)

        producer = threading.Thread(target=produce, name=f"espeak-synth:{request.request_id}",
                                    daemon=True)
        producer.start()
        try:
            while True:
                if wait or not sink.out.empty():
                    item = sink.out.get()
                else:
                    yield None
                    item = sink.out.get()
                if item is None:
                    return
                if isinstance(item, EngineError):
                    raise item
                if cancel.is_set():
                    return
                yield item
        finally:
            # Reached on cancel, on error and when the consumer drops the generator: make the
            # callback abort so that the process-wide lock is released at once.
            sink.stop.set()
            producer.join(self.join_timeout_s)
            if producer.is_alive():
                log.warning("espeak producer %s still running after %.1f s",
                            producer.name, self.join_timeout_s)

    def close(self) -> None:
        # The library stays initialised: it is process-wide and other instances may still use it.
        self._library = None
