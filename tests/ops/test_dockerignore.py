"""``.dockerignore`` keeps what operators put in the repository root out of the build context.

docs/deployment.md has operators create ``models/chattts`` (ChatTTS weights), ``certs/`` (the TLS
certificate and its private key) and ``.env`` (the JWT secret) beside the Dockerfile, whose ``COPY . .``
took all three into both images. No image can be built here, so this lays out a context the way an
operator's checkout looks after following the docs, and asks the Docker SDK's own context filter
(``docker.utils.build.exclude_paths``, the rules ``docker build`` applies to ``.dockerignore``) what
would be sent. The paths are read from the docs' commands, so a new one there is checked too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from docker.utils.build import exclude_paths

from tests.support.processes import ROOT

DEPLOYMENT = ROOT / "docs" / "deployment.md"
# What an operator's files look like in each created place (weights, certbot's layout, a plain cert pair).
CONTENTS = {
    "models/chattts": ["asset/Vocos.safetensors", "asset/gpt/model.safetensors", "asset/tokenizer/vocab.txt"],
    "certs": ["fullchain.pem", "privkey.pem", "live/voice.example.com/privkey.pem"],
}


def dockerignore_patterns() -> list[str]:
    """The patterns as ``docker build`` reads them: one a line, ``#`` lines are comments."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def created_by_the_docs() -> set[str]:
    """Relative paths the deployment docs' shell commands create: ``mkdir -p X``, ``cp … X/``,
    ``cat >> X`` (absolute paths are outside the context)."""
    text = DEPLOYMENT.read_text()
    found = set(re.findall(r"mkdir -p ([^\s/;&][^\s;&]*)", text))
    found |= {m.rstrip("/") for m in re.findall(r"\bcp [^\n]*? ([^\s/]+/)\s", text)}
    found |= set(re.findall(r"cat >> ([^\s/]\S*)", text))
    return {path for path in found if not path.startswith(("/", "$"))}


def test_the_docs_name_the_places_this_test_knows() -> None:
    assert {"models/chattts", "certs", ".env"} <= created_by_the_docs()


def test_nothing_an_operator_creates_reaches_the_build_context(tmp_path: Path) -> None:
    context = tmp_path / "context"
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    for name in tracked:
        if (ROOT / name).is_file():
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, context / name)
    secret_files: list[str] = []
    for place in sorted(created_by_the_docs()):
        for name in CONTENTS.get(place, [""]):
            path = Path(place, name) if name else Path(place)
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            (context / path).write_text("operator's own\n")
            secret_files.append(path.as_posix())
    # Stray keys anywhere in the tree, and an .env variant.
    for extra in ("nginx/tls/privkey.pem", "scripts/client.key", ".env.production"):
        (context / extra).write_text("operator's own\n")
        secret_files.append(extra)

    sent = set(exclude_paths(str(context), dockerignore_patterns(), dockerfile="Dockerfile"))
    assert sorted(set(secret_files) & sent) == []
    # and the image still gets everything it installs from
    needed = ["Dockerfile", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "app/main.py",
              "voxroom_cli/main.py", "workers/intake/worker.py", "voxroom/voices/voices.json", "client_js/voxroom.js",
              "client_js/demo/index.html"]
    assert [name for name in needed if name not in sent] == []
