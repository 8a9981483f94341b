"""``voxroom serve``: one command, its own Redis, a room end to end, a clean stop."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.support.processes import ROOT, base_env, wait_http
from tests.support.room_client import RoomClient
from voxroom.store.server import free_port


async def test_serve_runs_a_room_and_stops_without_orphans(tmp_path: Path) -> None:
    port = free_port()
    env = base_env("")
    env.pop("REDIS_URL")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "voxroom_cli", "serve", "--port", str(port), "--insecure-dev",
                             "--contexts", "1"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        children = psutil.Process(proc.pid).children(recursive=True)
        names = {c.name() for c in children}
        assert any("redis-server" in n for n in names), names
        async with RoomClient(port, "lobby") as client:
            await client.wait_for(lambda g: True, 0)
            await client.say("Welcome to the village.", voice="en-espeak")
            ends = await client.wait_ends(1, timeout=60)
            assert ends[0]["status"] == "ok"
            assert len(client.got.frames_of(1)) > 10
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], f"orphans left behind: {[(p.pid, p.name()) for p in alive]}"
        assert "voxroom serving on http://127.0.0.1:" in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
