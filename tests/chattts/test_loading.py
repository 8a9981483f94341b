"""Loading through ChatTTS's own loader: good, missing, corrupt; finding weights without torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from voxroom.errors import EngineError, ModelNotFound
from workers.engines.chattts.loader import load_chat
from workers.engines.chattts.weights import ASSET_FILES, find_chattts_weights, hf_snapshot

pytestmark = pytest.mark.chattts


def test_custom_checkpoint_loads_through_chattts_loader(tiny_dir: Path) -> None:
    chat = load_chat(source="custom", custom_path=tiny_dir)
    assert chat.has_loaded(use_decoder=True)
    assert chat.config.gpt.hidden_size == 64  # voxroom_arch.json reached Chat.config
    assert chat.gpt.gpt.config.num_hidden_layers == 2


def test_missing_directory_is_model_not_found(tmp_path: Path) -> None:
    for source in ("custom", "local"):
        with pytest.raises(ModelNotFound, match="no ChatTTS weights in"):
            load_chat(source=source, custom_path=tmp_path / "nowhere")
    with pytest.raises(ModelNotFound, match="needs a directory"):
        load_chat(source="local", custom_path=None)


def test_local_source_checks_published_hashes(tiny_dir: Path) -> None:
    # The tiny model is complete but is not the published model: `local` must refuse it, not download.
    with pytest.raises(ModelNotFound, match="sha256"):
        load_chat(source="local", custom_path=tiny_dir)


def test_bad_source_is_engine_error() -> None:
    with pytest.raises(EngineError, match="source must be one of"):
        load_chat(source="s3", custom_path=None)


def _copy(tiny_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny_dir, dst)
    return dst


def test_corrupt_file_fails_hash_check(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    target = model / "asset" / "Decoder.safetensors"
    data = bytearray(target.read_bytes())
    data[-10] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ModelNotFound, match="sha256"):
        load_chat(source="custom", custom_path=model)


def test_corrupt_file_with_matching_hash_is_model_not_found(tiny_dir: Path, tmp_path: Path) -> None:
    # A truncated file whose hash was (wrongly) updated: the error comes from safetensors deep inside
    # Chat.load and must still arrive as one clear ModelNotFound.
    model = _copy(tiny_dir, tmp_path)
    target = model / "asset" / "Vocos.safetensors"
    target.write_bytes(target.read_bytes()[:1000])
    sha = json.loads((model / "sha256_map.json").read_text())
    import hashlib
    sha["sha256_asset_Vocos_safetensors"] = hashlib.sha256(target.read_bytes()).hexdigest()
    (model / "sha256_map.json").write_text(json.dumps(sha))
    with pytest.raises(ModelNotFound, match="could not be loaded"):
        load_chat(source="custom", custom_path=model)


def test_custom_without_hash_map_is_model_not_found(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_dir, tmp_path)
    (model / "sha256_map.json").unlink()
    with pytest.raises(ModelNotFound, match=r"sha256_map\.json"):
        load_chat(source="custom", custom_path=model)


def _fake_tree(root: Path) -> None:
    for name in ASSET_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


def test_find_weights_order(tmp_path: Path) -> None:
    explicit, env_dir, hub = tmp_path / "explicit", tmp_path / "env", tmp_path / "hf"
    snap = hub / "hub" / "models--2Noise--ChatTTS" / "snapshots" / "abc123"
    for d in (explicit, env_dir, snap):
        _fake_tree(d)
    env = {"HF_HOME": str(hub), "VOXROOM_CHATTTS_DIR": str(env_dir)}
    assert find_chattts_weights(explicit, environ=env) == explicit
    assert find_chattts_weights(None, environ=env) == env_dir
    assert find_chattts_weights(None, environ={"HF_HOME": str(hub)}) == snap
    assert hf_snapshot(environ={"HF_HOME": str(hub)}) == snap
    assert find_chattts_weights(None, source="local", environ={"HF_HOME": str(hub)}) is None
    (snap / "asset" / "gpt" / "model.safetensors").unlink()  # incomplete snapshot: not found
    assert find_chattts_weights(None, environ={"HF_HOME": str(hub)}) is None
    assert find_chattts_weights(tmp_path / "empty", environ={}) is None


def test_package_imports_without_torch(tmp_path: Path) -> None:
    """The worker's `auto` mode probes for ChatTTS on machines without torch: importing the package and
    finding weights must not import torch."""
    code = ("import sys; import workers.engines.chattts as c; "
            "print(c.find_chattts_weights(None, environ={}), c.chattts_installed()); "
            "assert 'torch' not in sys.modules and 'ChatTTS' not in sys.modules, 'torch imported'")
    env = {**os.environ, "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parents[2], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "True"]
