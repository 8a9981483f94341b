"""The GPU check script runs unchanged on the CPU (here: no GPU is lent to this project's tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.chattts

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_small_mode_runs_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}  # fresh tiny model under tmp
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--small", "--device", "cpu"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("TTFC ours") and "RTF ours" in line for line in lines), out.stdout
    assert sum(line.startswith("batch ") for line in lines) == 2
    assert lines[-1] == "gpu_check: ok"
