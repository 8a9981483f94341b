"""One build step pyproject.toml cannot say: the browser client ships inside the wheel.

The gateway serves ``client_js/`` at ``/client/`` and its demo page at ``/``. That folder sits beside
the Python packages (it is also the npm package ``@voxroom/client``), so package data cannot name it:
a non-editable install (the Dockerfile's ``pip install ".[offline,opus]"``) had no client, and
``/client/voxroom.js`` answered 500. Here ``build_py`` copies what the gateway serves into the built
``app/client_js/``, where ``app/client_files.py`` looks first; an editable install and the source tree
serve the repository's own ``client_js/``. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CLIENT = Path(__file__).resolve().parent / "client_js"
SHIPPED = ("*.js", "package.json", "README.md", "demo/*.html", "demo/*.js", "demo/*.css")
"""What the gateway serves: the modules (the worklet included), and the demo page with its files."""


class BuildPyWithClient(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the source tree's client_js/ is served as it is
        target = Path(self.build_lib) / "app" / "client_js"
        for pattern in SHIPPED:
            for source in sorted(CLIENT.glob(pattern)):
                dest = target / source.relative_to(CLIENT)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildPyWithClient})
