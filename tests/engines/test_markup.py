"""Pauses in say text: parsed at the edge, refused when not understood, and exact on real engines."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.audio import frame_rms
from tests.support.engines import synthesize
from voxroom.errors import EngineError
from voxroom.voices import markup
from voxroom.voices.catalog import Catalog
from voxroom.voices.markup import MarkupError, Pause, parse
from voxroom.wire import protocol
from voxroom.wire.protocol import ErrorCode, ProtocolError, Say
from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.espeak import EspeakEngine
from workers.engines.lexicon import Lexicon
from workers.engines.piper.engine import PiperEngine
from workers.engines.synthetic import SyntheticEngine
from workers.engines.wrappers import MARKUP_VERSION, NarratorEngine, RewritingEngine, wrap

SLICE_MS = protocol.SLICE_MS
LOUD_DBFS = -40.0
"""What the measurement calls sound: a 10 ms frame louder than this (quiet speech sits at -30 to
-15 dBFS)."""


def say(text: str) -> Say:
    msg = protocol.parse_client_message({"type": "say", "seq": 3, "text": text})
    assert isinstance(msg, Say)
    return msg


def longest_silence_ms(audio: npt.NDArray[np.floating], rate: int) -> float:
    """The longest stretch in which no 10 ms frame (hop 1 ms) is louder than :data:`LOUD_DBFS`,
    between the first and the last loud frame."""
    env = frame_rms(audio, rate, frame_ms=10.0, hop_ms=1.0)
    loud = np.flatnonzero(env > 10 ** (LOUD_DBFS / 20))
    assert loud.size > 2, "no sound at all"
    # Loud frames i and j (10 ms long, 1 ms apart) leave j - i - 10 ms between them unheard.
    return float(np.diff(loud).max() - 10)


# -- the markup, sans I/O -----------------------------------------------------------------------


def test_both_spellings_cut_the_line_at_its_pauses() -> None:
    assert parse("The night falls. [pause:700] Open your eyes.").pieces == (
        "The night falls.", Pause(700), "Open your eyes.")
    for spelling in ('<break time="700ms"/>', "<break time='0.7s' />", '<BREAK TIME="700MS"/>', "[ Pause : 700 ]",
                     "[pause:700ms]", "[pause:300][pause:400]", '[pause:200]<break time="0.5s"/>'):
        assert parse(f"a {spelling} b").pieces == ("a", Pause(700), "b"), spelling
    assert parse('[pause:250] go <break time="1s"/>').pieces == (Pause(250), "go", Pause(1000))
    # Brackets and angles that do not look like markup are text, spoken as before.
    for text in ("see [1] and [2.5]", "3 < 5 and 7 > 2", "a < b > c", "I <3 you", "[...]"):
        assert parse(text).pieces == (text,)


@pytest.mark.parametrize("text", [
    "[pause]", "x [foo:1] y", "[pause:abc]", "[pause:-5]", "<break>", "<break/>", '<break strength="weak"/>',
    "<speak>hi</speak>", "hi </s>", "<!-- note -->", "x [sic] y", "[[h@l'oU]]", "[[ 1 ]]", "wait [pause:500",
    'wait <break time="5ms"', "[laugh] ok", '<break time="500"/>', '<break time="2m"/>',
])
def test_markup_that_is_not_understood_is_refused_never_spoken(text: str) -> None:
    with pytest.raises(MarkupError, match="not understood"):
        parse(text)
    with pytest.raises(ProtocolError) as err:
        say(f"Hello {text} world")
    assert err.value.code == ErrorCode.BAD_MESSAGE and err.value.seq == 3


def test_limits_count_spoken_text_and_bound_the_pauses() -> None:
    words = "x" * protocol.MAX_TEXT_CHARS
    # 500 characters to speak plus markup: accepted, the markup kept for the worker.
    assert say(f"{words[:250]} [pause:100] {words[250:-1]}").text.count("[pause:100]") == 1
    with pytest.raises(ProtocolError) as err:
        say(f"{words[:250]} [pause:100] {words[250:]}x")
    assert err.value.code == ErrorCode.TEXT_TOO_LONG
    with pytest.raises(ProtocolError) as err:
        say("[pause:500] <break time='1s'/>")
    assert err.value.code == ErrorCode.EMPTY_TEXT
    assert parse(f"a [pause:{markup.MAX_PAUSE_MS}] b").pause_ms == markup.MAX_PAUSE_MS
    for text in (f"a [pause:{markup.MAX_PAUSE_MS // 2}] b [pause:{markup.MAX_PAUSE_MS // 2 + 1}] c",
                 "a " + "[pause:1] b " * (markup.MAX_PAUSES + 1)):
        with pytest.raises(MarkupError):
            parse(text)
        with pytest.raises(ProtocolError) as err:
            say(text)
        assert err.value.code == ErrorCode.BAD_MESSAGE


# -- real engines ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def narrated_piper(piper: PiperEngine) -> NarratorEngine:
    return NarratorEngine(piper)


@pytest.fixture(scope="module")
def narrated_espeak(espeak: EspeakEngine) -> NarratorEngine:
    return NarratorEngine(espeak)


LINES = {
    "en-joe": ("The night falls.", "Werewolves, open your eyes."),
    "en-espeak": ("The night falls.", "Werewolves, open your eyes."),
    "cmn-espeak": ("天黑请闭眼。", "狼人请睁眼。"),
    "yue-espeak-f": ("天黑请闭眼。", "狼人请睁眼。"),
}


@pytest.mark.parametrize("voice_id", sorted(LINES))
@pytest.mark.parametrize("pause", ["[pause:700]", '<break time="0.7s"/>'])
def test_the_silence_between_the_words_is_the_pause(voice_id: str, pause: str, catalog: Catalog,
                                                    narrated_piper: NarratorEngine,
                                                    narrated_espeak: NarratorEngine) -> None:
    voice = catalog.get(voice_id)
    engine = narrated_piper if voice.engine == "piper" else narrated_espeak
    before, after = LINES[voice_id]
    out = synthesize(engine, voice, f"{before} {pause} {after}")
    gap = longest_silence_ms(out.audio, out.rate)
    assert abs(gap - 700) <= SLICE_MS, f"{voice_id}: {gap:.0f} ms of silence between the words"
    # Never read aloud ("pause seven hundred" would take over a second): the line lasts what its
    # two pieces and the pause last, less the padding trimmed at the pause (Piper's durations also
    # vary from run to run by a few per cent).
    alone = sum(synthesize(engine.inner, voice, text).seconds for text in (before, after))
    assert 0.7 + alone - 0.5 <= out.seconds <= 0.7 + alone + 0.3


def test_zeros_added_to_the_engine_padding_would_miss_the_pause(catalog: Catalog, piper: PiperEngine,
                                                                narrated_piper: NarratorEngine) -> None:
    """Why the wrapper trims: Piper's own edges add well over a slice to a pause."""
    voice = catalog.get("en-joe")
    before, after = LINES["en-joe"]
    naive = np.concatenate([synthesize(piper, voice, before).audio, np.zeros(int(0.7 * piper.sample_rate)),
                            synthesize(piper, voice, after).audio])
    assert longest_silence_ms(naive, piper.sample_rate) > 700 + SLICE_MS
    trimmed = synthesize(narrated_piper, voice, f"{before} [pause:700] {after}")
    assert abs(longest_silence_ms(trimmed.audio, trimmed.rate) - 700) <= SLICE_MS


def test_pauses_at_the_edges_and_a_line_without_pauses(catalog: Catalog, narrated_espeak: NarratorEngine) -> None:
    voice = catalog.get("en-espeak")
    synthetic = SyntheticEngine(ttfc_ms=0.0, rtf=0.0)  # deterministic, unlike espeak-ng
    plain = synthesize(synthetic, voice, "Good morning.")
    assert np.array_equal(synthesize(wrap(synthetic), voice, "Good morning.").audio, plain.audio)
    edged = synthesize(narrated_espeak, voice, "[pause:400] Good morning. [pause:300]")
    rate = edged.rate
    lead = int(np.flatnonzero(np.abs(edged.audio) > 1e-4)[0])
    tail = edged.audio.size - 1 - int(np.flatnonzero(np.abs(edged.audio) > 1e-4)[-1])
    assert abs(lead / rate * 1000 - 400) <= SLICE_MS and abs(tail / rate * 1000 - 300) <= SLICE_MS
    with pytest.raises(EngineError, match="not understood"):
        synthesize(narrated_espeak, voice, "Good [morning:1]")


def test_a_cancelled_line_stops_between_pieces(catalog: Catalog, narrated_espeak: NarratorEngine) -> None:
    out = synthesize(narrated_espeak, catalog.get("en-espeak"), "One. [pause:2000] Two. [pause:2000] Three.",
                     cancel_after=1)
    assert out.seconds < 2.0


# -- the wrappers' contract -------------------------------------------------------------------


class Recorder:
    """A batch engine that records the text it is given (what ChatTTS would read)."""

    name = "recorder"
    sample_rate = 24_000
    max_batch = 4
    continuous = False

    def __init__(self) -> None:
        self.texts: list[str] = []

    def load(self, device: str) -> None:
        pass

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        self.texts.append(request.text)
        yield np.zeros(10, np.float32)

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, Pcm]]:
        for row, request in enumerate(requests):
            self.texts.append(request.text)
            yield row, np.zeros(10, np.float32)

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | None]]:
        while (rows := admit(0)) is not None and rows:
            for key, request, _cancel in rows:
                self.texts.append(request.text)
                yield key, None

    def close(self) -> None:
        pass


def test_batch_engines_get_their_own_breaks_never_the_markup(catalog: Catalog) -> None:
    voice = catalog.get("en-joe")
    inner = Recorder()
    engine = wrap(inner, Lexicon.from_text("seer\tSeeer\n"))
    assert isinstance(engine, RewritingEngine) and engine.max_batch == 4 and engine.continuous is False
    requests = [SynthesisRequest("The Seer wakes. [pause:500] Quickly [pause:300] now", voice),
                SynthesisRequest('Hi <break time="1s"/> there', voice)]
    list(engine.stream_batch(requests, [threading.Event(), threading.Event()]))
    assert inner.texts == ["The Seeer wakes. Quickly , now", "Hi , there"]
    inner.texts.clear()
    pending: list[list[tuple[Hashable, SynthesisRequest, threading.Event]] | None] = [
        [("k", requests[0], threading.Event())], None]
    assert list(engine.stream_continuous(lambda timeout: pending.pop(0))) == [("k", None)]
    assert inner.texts == ["The Seeer wakes. Quickly , now"]
    # The ChatTTS hook: an engine with break text of its own gets that instead of a comma.
    inner.pause_text = lambda ms: "[lbreak]" if ms >= 500 else "[uv_break]"
    inner.texts.clear()
    list(engine.stream(requests[0], threading.Event()))
    assert inner.texts == ["The Seeer wakes. [lbreak] Quickly [uv_break] now"]
    # An engine that renders the markup itself gets it as written, its words respelled.
    inner.markup_native = True
    inner.texts.clear()
    list(engine.stream(requests[0], threading.Event()))
    assert inner.texts == ["The Seeer wakes. [pause:500] Quickly [pause:300] now"]


def test_wrappers_show_the_engine_and_key_the_cache_on_markup_and_lexicon() -> None:
    synthetic = SyntheticEngine(ttfc_ms=0.0, rtf=0.0)
    plain = wrap(synthetic)
    assert isinstance(plain, NarratorEngine) and plain.name == "synthetic" and plain.rtf == 0.0
    assert plain.sample_rate == synthetic.sample_rate and plain.max_batch == 1
    assert plain.model_version == f"+{MARKUP_VERSION}"
    one = wrap(synthetic, Lexicon.from_text("seer\tSeeer\n")).model_version
    two = wrap(synthetic, Lexicon.from_text("seer\tSear\n")).model_version
    assert len({plain.model_version, one, two}) == 3 and MARKUP_VERSION in one
    batch = wrap(SyntheticEngine(max_batch=4, continuous=True))
    assert isinstance(batch, RewritingEngine) and batch.continuous is True


def test_every_voice_of_the_catalog_engines_is_wrapped_by_the_registry() -> None:
    from workers.engines.registry import create_engine

    assert isinstance(create_engine("espeak"), NarratorEngine)
    assert isinstance(create_engine("piper"), NarratorEngine)
