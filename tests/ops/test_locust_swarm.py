"""A short headless Locust swarm (real Locust, real gateway and worker) must see no failure and audio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ops.conftest import OpsStack
from tests.support.locust_stats import Entry, final_stats, json_file_args, summary, total_failures
from tests.support.processes import ROOT, start_gateway
from voxroom.wire.tokens import mint

LOCUSTFILE = ROOT / "locustfiles" / "voxroom_swarm.py"


def run_swarm(port: int, prefix: Path, *, users: int, seconds: int, per_room: int = 12,
              extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], dict[str, Entry], str]:
    """Run the swarm headless; its final stats by name, and a report for assertion messages."""
    args = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users),
            "-r", str(users), "-t", f"{seconds}s", "--host", f"ws://127.0.0.1:{port}", *json_file_args(prefix),
            "--stop-timeout", "5", "--loglevel", "WARNING", "--vx-users-per-room", str(per_room), *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 60)
    stats = final_stats(prefix)
    report = f"locust exit {proc.returncode}\n{summary(stats)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, stats, report


def test_short_swarm_has_no_failure_and_hears_audio(ops_stack: OpsStack, tmp_path: Path) -> None:
    proc, stats, report = run_swarm(ops_stack.port, tmp_path / "swarm", users=24, seconds=15)
    assert proc.returncode == 0, report
    assert total_failures(stats) == 0, report
    assert stats["connect"].requests == 24, report
    # Audio came back to speakers and reached listeners, with every line ending well.
    # Two rooms, one speaker each: a 1.4 s line and a 0.4 s pause, about 8 lines each in 15 s.
    assert stats["say->first audio"].requests >= 6, report
    assert stats["say->listener first frame"].requests >= 6 * 11, report
    assert stats["slice gap max"].requests >= 6 * 11, report


def test_swarm_with_a_room_token_on_an_auth_gateway(ops_stack: OpsStack, tmp_path: Path) -> None:
    secret = "ops-test-secret-" + "x" * 32
    gateway, port = start_gateway(ops_stack.redis_url, tmp_path, insecure=False, VOXROOM_JWT_SECRET=secret)
    try:
        # No subject: each user names itself with ?client=, so senders stay distinct.
        token = mint(secret, "*", "speaker", ttl_s=300)
        proc, stats, report = run_swarm(port, tmp_path / "auth", users=12, seconds=6, extra=("--vx-token", token))
        assert proc.returncode == 0 and total_failures(stats) == 0, report
        assert stats["say->first audio"].requests >= 1, report
        # A wrong token is refused at connect, and Locust reports it as failed connects.
        bad = mint("another-secret-" + "y" * 32, "*", "speaker")
        proc, stats, report = run_swarm(port, tmp_path / "bad", users=2, seconds=2, extra=("--vx-token", bad))
        assert proc.returncode != 0 and "connect" in stats, report
        assert (stats["connect"].requests, stats["connect"].failures) == (2, 2), report
    finally:
        gateway.stop()
