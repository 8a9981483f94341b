"""A short headless Locust swarm (real Locust, real gateway and worker) must see no failure and audio."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.ops.conftest import OpsStack
from tests.support.processes import ROOT, start_gateway
from voxroom.wire.tokens import mint

LOCUSTFILE = ROOT / "locustfiles" / "voxroom_swarm.py"


def run_swarm(port: int, csv_prefix: Path, *, users: int, seconds: int, per_room: int = 12,
              extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, str]]]:
    args = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users),
            "-r", str(users), "-t", f"{seconds}s", "--host", f"ws://127.0.0.1:{port}", "--csv", str(csv_prefix),
            "--only-summary", "--stop-timeout", "5", "--loglevel", "WARNING",
            "--vx-users-per-room", str(per_room), *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 60)
    with open(f"{csv_prefix}_stats.csv", newline="") as fh:
        stats = {row["Name"]: row for row in csv.DictReader(fh)}
    return proc, stats


def test_short_swarm_has_no_failure_and_hears_audio(ops_stack: OpsStack, tmp_path: Path) -> None:
    proc, stats = run_swarm(ops_stack.port, tmp_path / "swarm", users=24, seconds=15)
    report = f"locust exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    assert int(stats["Aggregated"]["Failure Count"]) == 0, report
    assert int(stats["connect"]["Request Count"]) == 24, report
    # Audio came back to speakers and reached listeners, with every line ending well.
    # Two rooms, one speaker each: a 1.4 s line and a 0.4 s pause, about 8 lines each in 15 s.
    assert int(stats["say->first audio"]["Request Count"]) >= 6, report
    assert int(stats["say->listener first frame"]["Request Count"]) >= 6 * 11, report
    assert int(stats["slice gap max"]["Request Count"]) >= 6 * 11, report


def test_swarm_with_a_room_token_on_an_auth_gateway(ops_stack: OpsStack, tmp_path: Path) -> None:
    secret = "ops-test-secret-" + "x" * 32
    gateway, port = start_gateway(ops_stack.redis_url, tmp_path, insecure=False, VOXROOM_JWT_SECRET=secret)
    try:
        # No subject: each user names itself with ?client=, so senders stay distinct.
        token = mint(secret, "*", "speaker", ttl_s=300)
        proc, stats = run_swarm(port, tmp_path / "auth", users=12, seconds=6, extra=("--vx-token", token))
        report = f"locust exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0 and int(stats["Aggregated"]["Failure Count"]) == 0, report
        assert int(stats["say->first audio"]["Request Count"]) >= 1, report
        # A wrong token is refused at connect, and Locust reports it as failed connects.
        bad = mint("another-secret-" + "y" * 32, "*", "speaker")
        proc, stats = run_swarm(port, tmp_path / "bad", users=2, seconds=2, extra=("--vx-token", bad))
        assert proc.returncode != 0 and int(stats["connect"]["Failure Count"]) == 2, proc.stdout[-3000:]
    finally:
        gateway.stop()
