#!/usr/bin/env bash
# Install the ChatTTS extra into a virtual environment, CPU torch pinned, and make torchaudio importable.
#
#   scripts/install_chattts.sh [PYTHON]        # PYTHON defaults to .venv/bin/python
#
# Why each step (measured, see ../shared/FACTS.md and docs/chattts.md):
#   * torch==2.13.0 is pinned: any other torch request (unpinned, >=, or pulled by a dependency) takes
#     PyPI's multi-GB CUDA build.
#   * requests: ChatTTS imports it without declaring it.
#   * transformers<5.40: ChatTTS passes past_key_values, which 5.40 removes.
#   * torchaudio goes in with --no-deps so that it cannot pull a second torch. PyPI's torchaudio 2.11 wheels are
#     CUDA builds: their three .so files fail to load against CPU torch (libc10_cuda.so missing). ChatTTS only
#     uses torchaudio.transforms.MelSpectrogram (in ChatTTS/model/dvae.py), which is pure Python; without the .so
#     files torchaudio takes its pure-Python fallback. We rename them to *.so.cuda-disabled rather than edit
#     ChatTTS, and only when they do not load (a matching CPU/CUDA pair is left alone).
# Idempotent: a second run checks `import ChatTTS` first and exits in about a second.
set -euo pipefail

PY="${1:-.venv/bin/python}"
if [[ ! -x "$PY" ]]; then
  echo "install_chattts: $PY is not an executable python" >&2
  exit 2
fi

check() {
  "$PY" - <<'PYEOF'
import importlib.metadata as md
import sys
try:
    import torch
    import torchaudio.transforms  # noqa: F401  (the import that fails with CUDA .so files)
    import ChatTTS  # noqa: F401
except Exception as exc:  # any failure means: (re)install
    print(f"install_chattts: not ready: {exc!r}", file=sys.stderr)
    sys.exit(1)
ok = torch.__version__.startswith("2.13.0") and md.version("chattts") == "0.2.5"
sys.exit(0 if ok else 1)
PYEOF
}

if check 2>/dev/null; then
  echo "install_chattts: ChatTTS already importable in $PY"
  exit 0
fi

# torch first and pinned, so that nothing later can choose another build.
"$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet "torch==2.13.0" "chattts==0.2.5" requests "transformers<5.40"
"$PY" -m pip install --quiet --no-deps torchaudio

# Neutralise torchaudio's compiled extension when it cannot load against this torch.
"$PY" - <<'PYEOF'
import importlib.util
import pathlib
import subprocess
import sys

spec = importlib.util.find_spec("torchaudio")
if spec is None or spec.origin is None:
    sys.exit("install_chattts: torchaudio is not installed")
lib = pathlib.Path(spec.origin).parent / "lib"
probe = subprocess.run([sys.executable, "-c", "import torchaudio"], capture_output=True, text=True)
if probe.returncode == 0:
    print("install_chattts: torchaudio loads as installed; leaving its extension alone")
    sys.exit(0)
for so in sorted(lib.glob("*.so")):
    so.rename(so.with_name(so.name + ".cuda-disabled"))
    print(f"install_chattts: disabled {so.name} (CUDA build against CPU torch)")
PYEOF

if ! check; then
  echo "install_chattts: ChatTTS still does not import; see the messages above" >&2
  exit 1
fi
echo "install_chattts: ChatTTS ready in $PY"
