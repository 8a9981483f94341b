"""The pronunciation lexicon: the file format, matching, and what it does to real engines' audio."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.engines import synthesize
from voxroom.errors import ConfigError
from voxroom.runtime.settings import Settings
from voxroom.voices.catalog import Catalog
from workers.engines.base import Pcm, SynthesisRequest
from workers.engines.espeak import EspeakEngine
from workers.engines.lexicon import MAX_ENTRIES, Lexicon
from workers.engines.piper.engine import PiperEngine
from workers.engines.wrappers import NarratorEngine

FILE = """\
# a game's names, as the narrator must say them
Lupin\tLoo pan\tespeak=l'u:p@n\tpiper=lˈuːpən
seer\tseeer
werewolf\twere wolf
Werewolf King\tthe wolf king
US\tyou ess
Dr\tDoctor
NPC\t恩皮西
GM\tgame master of the village
重庆\t虫庆
银行\t银航
"""


@pytest.fixture(scope="module")
def lexicon() -> Lexicon:
    return Lexicon.from_text(FILE)


def test_case_aware_longest_first_whole_words(lexicon: Lexicon) -> None:
    assert len(lexicon) == 10
    apply = lexicon.apply
    # Lower-case keys match any case; a key with a capital only as written.
    assert apply("The Seer, the SEER and the seer.") == "The seeer, the seeer and the seeer."
    assert apply("US troops, us two") == "you ess troops, us two"
    # Longest first: the phrase beats its first word; whitespace inside a phrase may vary.
    assert apply("Werewolf King and werewolf") == "the wolf king and were wolf"
    assert apply("Werewolf  King") == "the wolf king"
    # Whole words only: no match inside a longer Latin word.
    assert apply("Seers overseer Drs Dr.") == "Seers overseer Drs Doctor."
    # Chinese keys match inside Chinese text, and a Latin key next to Chinese characters too.
    assert apply("我在重庆的银行工作") == "我在虫庆的银航工作"
    assert apply("你是NPC吗") == "你是恩皮西吗"
    # Per-engine phonemes replace the respelling for that engine only.
    assert apply("Lupin wakes") == "Loo pan wakes"
    assert apply("Lupin wakes", "espeak") == "[[l'u:p@n]] wakes"
    assert apply("Lupin wakes", "piper") == "[[lˈuːpən]] wakes"
    assert Lexicon([]).apply("Lupin") == "Lupin" and Lexicon([]).version == ""


@pytest.mark.parametrize(("text", "line", "why"), [
    ("# header\n\nLupin\n", 3, "respelling"),
    ("a\tb\nseer\tx\nSeer\ty\nSEER\tz\nseer\tw\n", 5, "already defined on line 2"),
    ("a\tb\nx\ty\tfestival=abc\n", 2, "engine=phonemes"),
    ("a\tb\nc\td\nx\t[pause:5]\n", 3, "bracket"),
    ("x\t<b>y</b>\n", 1, "bracket"),
    ("x" * 65 + "\ty\n", 1, "longer than 64"),
    ("a\tb\nx\tespeak=\n", 2, "respelling"),
])
def test_a_bad_file_is_refused_with_its_line(text: str, line: int, why: str, tmp_path: Path) -> None:
    path = tmp_path / "lexicon.tsv"
    path.write_text(text, "utf-8")
    with pytest.raises(ConfigError, match=f"lexicon.tsv:{line}: .*{why}"):
        Lexicon.load(path)


def test_unreadable_and_oversized_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read lexicon"):
        Lexicon.load(tmp_path / "missing.tsv")
    (tmp_path / "latin1.tsv").write_bytes("caf\xe9\tcafay\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="cannot read lexicon"):
        Lexicon.load(tmp_path / "latin1.tsv")
    with pytest.raises(ConfigError, match=f":{MAX_ENTRIES + 1}: more than"):
        Lexicon.from_text("".join(f"w{i}\tx\n" for i in range(MAX_ENTRIES + 1)))


def test_the_version_follows_every_entry(lexicon: Lexicon) -> None:
    same = Lexicon.from_text("\n# reordered comments do not matter\n" + FILE)
    assert same.version == lexicon.version
    for changed in (FILE.replace("seeer", "sear"), FILE.replace("piper=lˈuːpən", "piper=lˈuːpɪn"),
                    FILE + "Moon\tmoon\n", FILE.replace("US\tyou ess\n", "")):
        assert Lexicon.from_text(changed).version != lexicon.version


def test_the_setting_names_the_file_and_a_bad_one_stops_the_worker_build(tmp_path: Path) -> None:
    from workers.launch import build_worker

    bad = tmp_path / "bad.tsv"
    bad.write_text("seer\tseeer\nLupin\n", "utf-8")
    settings = Settings.from_env({"VOXROOM_LEXICON": str(bad), "VOXROOM_ENGINE": "synthetic"})
    assert settings.lexicon == str(bad)
    with pytest.raises(ConfigError, match=r"bad\.tsv:2: "):
        build_worker(settings, store=None)  # type: ignore[arg-type]  # refused before Redis is used


# -- what it does to real engines ---------------------------------------------------------------


class Recorder:
    """A one-at-a-time engine that records the text it is given."""

    name = "espeak"
    sample_rate = 22_050
    max_batch = 1

    def __init__(self) -> None:
        self.texts: list[str] = []

    def load(self, device: str) -> None:
        pass

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        self.texts.append(request.text)
        yield np.full(2205, 0.1, np.float32)

    def close(self) -> None:
        pass


def test_words_are_respelled_never_the_markup(lexicon: Lexicon, catalog: Catalog) -> None:
    inner = Recorder()
    engine = NarratorEngine(inner, lexicon=lexicon)
    synthesize(engine, catalog.get("cmn-espeak"), "重庆到了 [pause:300] Lupin, seer <break time='1s'/> NPC")
    assert inner.texts == ["虫庆到了", "[[l'u:p@n]], seeer", "恩皮西"]


def test_the_lexicon_changes_what_real_engines_say(lexicon: Lexicon, catalog: Catalog, piper: PiperEngine,
                                                   espeak: EspeakEngine) -> None:
    for inner, voice_id, line, respelled in (
            (espeak, "en-espeak", "The GM calls Lupin.", "The game master of the village calls [[l'u:p@n]]."),
            (piper, "en-joe", "The GM calls Lupin.", "The game master of the village calls [[lˈuːpən]]."),
            (espeak, "cmn-espeak", "你是NPC吗？", "你是恩皮西吗？")):
        voice = catalog.get(voice_id)
        plain = synthesize(inner, voice, line)
        wrapped = synthesize(NarratorEngine(inner, lexicon=lexicon), voice, line)
        direct = synthesize(inner, voice, respelled)
        # What is said is the respelling: about as long as the respelling said directly (Piper's
        # durations vary from run to run by a few per cent), far longer than the line as written.
        assert abs(wrapped.seconds - direct.seconds) <= 0.08 * direct.seconds, (voice_id, wrapped.seconds,
                                                                               direct.seconds)
        assert wrapped.seconds - plain.seconds >= 0.2, (voice_id, wrapped.seconds, plain.seconds)
