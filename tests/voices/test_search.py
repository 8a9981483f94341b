"""Scene search over the catalog: exact top-k on tag vectors, and the scene field of ``say``."""

from __future__ import annotations

import numpy as np
import pytest

from app.ingress.voice_search import (
    DIM,
    VOCAB_DIMS,
    VOCABULARY,
    VoiceIndex,
    embed,
    features,
    index_for,
    resolve_scene,
    top_k,
)
from voxroom.errors import ConfigError, UnknownVoice
from voxroom.voices.catalog import Catalog, Voice
from voxroom.voices.languages import UnknownLanguage
from voxroom.wire.protocol import ErrorCode, ProtocolError, Say, parse_client_message


def _voice(vid: str, language: str, **tags: str) -> Voice:
    return Voice(vid, "espeak", language, tags=tags, params={"voice": vid})


CATALOG = Catalog([
    _voice("en-m", "eng", gender="male", age="adult", emotion="neutral"),
    _voice("en-f-angry", "eng", gender="female", age="adult", emotion="angry"),
    _voice("yue-m", "yue", gender="male", age="adult", emotion="neutral"),
    _voice("yue-f", "yue", gender="female", age="young", emotion="happy"),
    _voice("cmn-m", "cmn", gender="male", age="elderly", emotion="calm"),
    _voice("cmn-sc", "cmn", gender="male", age="adult", dialect="sichuanese"),
], "en-m")


def ids(scene: dict[str, str], k: int = 3) -> list[str]:
    return [m.voice.id for m in index_for(CATALOG).search(scene, k)]


def test_language_dominates_and_tags_break_the_tie() -> None:
    assert ids({"language": "cantonese", "gender": "female"})[:2] == ["yue-f", "yue-m"]
    assert ids({"language": "zh-HK", "emotion": "angry"})[:2] == ["yue-m", "yue-f"]
    assert ids({"language": "en", "emotion": "furious"})[0] == "en-f-angry"  # synonym of angry


def test_sichuan_finds_the_sichuanese_voice_then_other_mandarin_then_other_chinese() -> None:
    found = ids({"language": "sichuan"}, k=4)
    assert found[0] == "cmn-sc"
    assert found[1] == "cmn-m"
    assert set(found[2:]) == {"yue-m", "yue-f"}  # the same macrolanguage before English


def test_scores_are_cosines_best_first_and_an_exact_match_scores_one() -> None:
    found = index_for(CATALOG).search({"language": "yue", "gender": "female", "age": "young", "emotion": "happy"}, 6)
    scores = [m.score for m in found]
    assert scores == sorted(scores, reverse=True)
    assert found[0].voice.id == "yue-f" and found[0].score == pytest.approx(1.0, abs=1e-5)
    assert -1.0 <= scores[-1] <= 1.0


def test_allowed_filters_and_resolve_scene_raises_when_nothing_is_left() -> None:
    no_yue = index_for(CATALOG).search({"language": "yue"}, 3, lambda v: v.language != "yue")
    assert [m.voice.id for m in no_yue][:2] == ["cmn-m", "cmn-sc"]  # same macrolanguage first
    only_en = index_for(CATALOG).search({"language": "yue"}, 2, lambda v: v.language == "eng")
    assert only_en == []  # never the nearest voice of another language family
    assert ids({"language": "fra", "gender": "female"}) == []
    with pytest.raises(UnknownVoice):
        resolve_scene(CATALOG, {"language": "fra", "gender": "female"})
    with pytest.raises(UnknownLanguage):
        resolve_scene(CATALOG, {"language": "cantones", "gender": "female"})
    assert ids({"gender": "female"}, 2) == ["en-f-angry", "yue-f"]  # no language: every voice counts
    assert resolve_scene(CATALOG, {"gender": "female", "language": "eng"}).id == "en-f-angry"
    with pytest.raises(UnknownVoice):
        resolve_scene(CATALOG, {"language": "yue"}, lambda v: False)


def test_top_k_matches_a_full_sort_and_keeps_catalog_order_on_ties() -> None:
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((500, DIM)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[3] + 0.1 * rng.standard_normal(DIM).astype(np.float32)
    rows, scores = top_k(matrix, query, 10)
    expected = np.argsort(-(matrix @ query), kind="stable")[:10]
    assert rows.tolist() == expected.tolist()
    assert rows[0] == 3
    tied = np.tile(matrix[:1], (5, 1))
    assert top_k(tied, matrix[0], 3)[0].tolist() == [0, 1, 2]


def test_known_features_have_their_own_dimension_and_unknown_ones_are_hashed_after_them() -> None:
    assert len(VOCABULARY) == len(set(VOCABULARY)) <= VOCAB_DIMS
    known = embed({"gender=female": 1.0})
    assert np.flatnonzero(known).tolist() == [VOCABULARY.index("gender=female")]
    unknown = embed({"accent=scottish": 1.0})
    assert np.flatnonzero(unknown)[0] >= VOCAB_DIMS
    assert np.array_equal(embed(features({"accent": "scottish"})), embed(features({"Accent": " Scottish "})))


def test_a_stored_vector_is_used_and_must_have_the_space_dimension() -> None:
    happy = embed(features({"emotion": "happy"}))
    sad = embed(features({"emotion": "sad"}))
    blend = Voice("blend", "espeak", "eng", tags={"emotion": "calm"}, vector=tuple((0.7 * happy + 0.3 * sad).tolist()))
    index = VoiceIndex([blend, _voice("plain", "eng", emotion="calm")])
    assert index.search({"emotion": "happy"}, 1)[0].voice.id == "blend"
    with pytest.raises(ConfigError):
        VoiceIndex([Voice("bad", "espeak", "eng", vector=(1.0, 0.0))])


def test_the_bundled_catalog_answers_scenes_with_real_voices() -> None:
    catalog = Catalog.load()
    assert resolve_scene(catalog, {"language": "cantonese", "gender": "female"}).id == "yue-espeak-f"
    assert resolve_scene(catalog, {"language": "mandarin", "age": "old", "gender": "woman"}).id == "cmn-espeak-grandma"
    assert resolve_scene(catalog, {"style": "narrator", "language": "english"}).id == "en-joe"


def test_say_takes_a_scene_instead_of_a_voice() -> None:
    scene = {"emotion": " angry ", "language": "yue"}
    msg = parse_client_message({"type": "say", "seq": 1, "text": "hi", "scene": scene})
    assert isinstance(msg, Say) and msg.scene == {"emotion": "angry", "language": "yue"} and msg.voice is None
    for bad in ({}, {"Emotion": "x"}, {"emotion": 3}, {"emotion": ""}, "angry", {f"t{i}": "x" for i in range(17)}):
        with pytest.raises(ProtocolError) as err:
            parse_client_message({"type": "say", "seq": 1, "text": "hi", "scene": bad})
        assert err.value.code == ErrorCode.BAD_MESSAGE and err.value.seq == 1
    with pytest.raises(ProtocolError, match="not both"):
        parse_client_message({"type": "say", "seq": 1, "text": "hi", "voice": "en-joe", "scene": {"age": "child"}})


def test_a_scene_in_an_unknown_language_is_refused_at_the_edge() -> None:
    for language in ("cantones", "klingonese", "x", "tlhIngan Hol"):
        with pytest.raises(ProtocolError) as err:
            parse_client_message({"type": "say", "seq": 4, "text": "hi",
                                  "scene": {"language": language, "gender": "female"}})
        assert err.value.code == ErrorCode.UNKNOWN_LANGUAGE == "unknown_language" and err.value.seq == 4
    for language in ("cantonese", "zh-HK", "fra", "粤语", "sichuan"):  # known, even with no voice
        msg = parse_client_message({"type": "say", "seq": 1, "text": "hi", "scene": {"language": language}})
        assert isinstance(msg, Say) and msg.scene == {"language": language}
