"""Where the browser client and the demo page are: served at ``/client/`` and ``/``.

An installed wheel carries them as ``app/client_js/`` (setup.py copies them in at build time); the
source tree and an editable install have the repository's ``client_js/`` beside ``app/``. ``None``
when neither holds the client: the gateway then serves rooms and the API without it, and says so.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
CANDIDATES = (_HERE / "client_js", _HERE.parent / "client_js")


def client_dir() -> Path | None:
    """The first candidate holding ``voxroom.js``."""
    for candidate in CANDIDATES:
        if (candidate / "voxroom.js").is_file():
            return candidate
    return None
