"""What a newcomer types after ``voxroom serve`` works as the README says (issue 28, "Docs a newcomer
trips on"): the printed ``redis-cli`` line reaches serve's own Redis, ``voxroom rooms`` finds that
Redis with ``REDIS_URL`` unset, a missing secret stops serve and gateway before any "serving on"
banner, and a bad ``--port`` is reported as the flag. Real processes, the real ``redis-cli``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import ROOT, base_env, wait_http
from tests.support.room_client import RoomClient
from voxroom.store.server import free_port


def _env(runtime: Path, **extra: str) -> dict[str, str]:
    env = base_env("", XDG_RUNTIME_DIR=str(runtime), **extra)
    env.pop("REDIS_URL")
    env.pop("VOXROOM_JWT_SECRET", None)
    return env


def _voxroom(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voxroom_cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _wait_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found
        assert proc.poll() is None, log.read_text()[-2000:]
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not printed:\n{log.read_text()[-2000:]}")


async def test_the_printed_redis_cli_line_and_voxroom_rooms_reach_serve_s_redis(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path)
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "voxroom_cli", "serve", "--port", str(port), "--insecure-dev",
                                 "--contexts", "1"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        banner = _wait_line(log_path, r"redis: (redis://127\.0\.0\.1:(\d+)/0)  \(look inside: (redis-cli -p \d+ "
                                      r"XRANGE '[^']+' - \+)", proc)
        redis_port, cli_line = banner[2], banner[3]
        async with RoomClient(port, "village") as client:
            await client.say("The night falls on the village.", voice="en-espeak")
            await client.wait_ends(1, timeout=60)
        # The line as printed, pasted into a shell.
        pasted = subprocess.run(cli_line, shell=True, capture_output=True, text=True, timeout=10, check=False)
        assert pasted.returncode == 0 and "The night falls on the village." in pasted.stdout, pasted
        assert f"-p {redis_port} " in cli_line
        # `voxroom rooms` with REDIS_URL unset: serve's Redis, not 127.0.0.1:6379.
        rooms = _voxroom("rooms", env=env)
        assert rooms.returncode == 0, rooms.stderr
        assert "village" in rooms.stdout, rooms.stdout
        assert f"voxroom serve (pid {proc.pid})" in rooms.stderr and f":{redis_port}/0" in rooms.stderr
        room = _voxroom("room", "village", env=env)
        assert room.returncode == 0 and "The night falls on the village." in room.stdout, room
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "voxroom-serve.json").exists(), "serve leaves nothing behind"
    # Its Redis is gone: the command says where it looked (the default), not a stale serve's port.
    after = _voxroom("rooms", env=env, timeout=30)
    assert f":{redis_port}/" not in after.stderr


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_missing_secret_stops_before_any_serving_banner(tmp_path: Path, command: str) -> None:
    env = _env(tmp_path, REDIS_URL="redis://127.0.0.1:1/0") if command == "gateway" else _env(tmp_path)
    done = _voxroom(command, "--port", str(free_port()), env=env)
    assert done.returncode == 2, done
    said = done.stdout + done.stderr
    assert "VOXROOM_JWT_SECRET" in said
    assert "serving on" not in said and "gateway on" not in said, said
    assert "redis:" not in done.stdout and "started redis-server" not in said, "serve started nothing"


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_bad_port_flag_is_reported_as_the_flag(tmp_path: Path, command: str) -> None:
    done = _voxroom(command, "--port", "70000", "--insecure-dev", env=_env(tmp_path))
    assert done.returncode == 2, done
    assert "--port 70000 must be" in done.stderr, done.stderr
    assert "VOXROOM_PORT" not in done.stderr
    # and the variable is still named as the variable
    env = _env(tmp_path, VOXROOM_PORT="70000")
    by_env = _voxroom(command, "--insecure-dev", env=env)
    assert by_env.returncode == 2 and "VOXROOM_PORT=70000 must be" in by_env.stderr, by_env.stderr

