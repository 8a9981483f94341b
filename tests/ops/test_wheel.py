"""The package as shipped: a wheel built the way the Dockerfile builds it serves the browser client.

The Dockerfile runs ``pip install ".[offline,opus]"`` (not editable): the gateway then answered
``/client/voxroom.js`` with 500 (``StaticFiles directory …/site-packages/client_js does not exist``)
and ``/`` with a JSON stub. Here the wheel is built from a copy of the tree (what ``COPY . .`` puts in
the image), installed into a fresh venv, and ``voxroom gateway`` runs from a directory that holds no
source, against a real redis-server. The venv takes the dependencies from this one (a ``.pth`` line:
no download), and nothing of the source tree.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ROOT, Proc, wait_http
from voxroom.store.server import free_port

pytestmark = pytest.mark.slow

SERVED = ["voxroom.js", "protocol.js", "jitter.js", "clock.js", "reconnect.js", "resume.js", "opus.js", "player.js",
          "worklet.js", "README.md", "demo/index.html", "demo/demo.js", "demo/demo.css"]


def _run(args: list[str], cwd: Path, timeout: float = 300) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _tree_copy(dest: Path) -> Path:
    """The files ``COPY . .`` would take that matter to pip: what git tracks or would track."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in names:
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _pip_wheel(source: Path, out: Path) -> Path:
    # This venv's setuptools (the test extra), offline; pip fetches one from PyPI where it is missing.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation,
          "--disable-pip-version-check", str(source), "-w", str(out)], cwd=source)
    (wheel,) = out.glob("voxroom-*.whl")
    return wheel


@dataclass
class Installed:
    wheel: Path
    venv: Path
    python: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    tree = _tree_copy(base / "tree")
    wheel = _pip_wheel(tree, base / "dist")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # This venv's dependencies, as a plain path: its .pth files (the editable install of the source
    # tree among them) are not run from there, so only the wheel provides voxroom, app and workers.
    Path(purelib, "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
          "--disable-pip-version-check", str(wheel)], cwd=base)
    yield Installed(wheel, venv, python)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXROOM_") and k != "PYTHONPATH"}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def test_the_wheel_holds_the_client_and_the_demo(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = [name for name in SERVED if f"app/client_js/{name}" not in names]
    assert not missing, f"not in {installed.wheel.name}: {missing}"


def test_a_wheel_built_from_the_sdist_holds_them_too(tmp_path: Path) -> None:
    """``python -m build`` (and PyPI) build the wheel from the sdist: MANIFEST.in must carry client_js."""
    tree = _tree_copy(tmp_path / "tree")
    _run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
          str(tmp_path / "sdist")], cwd=tree)
    (sdist,) = (tmp_path / "sdist").glob("voxroom-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    names = set(zipfile.ZipFile(_pip_wheel(unpacked, tmp_path / "dist")).namelist())
    assert [name for name in SERVED if f"app/client_js/{name}" not in names] == []


def test_the_installed_gateway_serves_the_client_and_the_demo_from_any_directory(
        installed: Installed, redis_url: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(installed.python), "-c", "import app.main; print(app.main.__file__)"],
                           cwd=elsewhere, env=_env(), capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(installed.venv), f"app came from {where}, not from the wheel"
    port = free_port()
    proc = Proc([str(installed.venv / "bin" / "voxroom"), "gateway", "--port", str(port), "--insecure-dev"],
                _env(REDIS_URL=redis_url, VOXROOM_LOG_LEVEL="INFO"), tmp_path / "gateway.log", cwd=elsewhere)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for name in SERVED:
                response = http.get(f"/client/{name}")
                assert response.status_code == 200, f"/client/{name}: {response.status_code} {response.text[:200]}"
                assert response.content == (ROOT / "client_js" / name).read_bytes(), name
            assert "javascript" in http.get("/client/voxroom.js").headers["content-type"]
            page = http.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert page.content == (ROOT / "client_js" / "demo" / "index.html").read_bytes()
            assert http.get("/client/no-such-file.js").status_code == 404
        assert "not installed" not in proc.log_text()
    finally:
        proc.stop()
