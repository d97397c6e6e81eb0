#!/usr/bin/env bash
# One-time set-up of a fresh Debian machine for mlagen (the README's first command, `make setup`):
#   everything it needs, then the main job: the library and the two leaderboard bundles.
#   CMake and Ninja (apt, when missing and run as root), jinja2, pytest, numpy, torch and kernelguard
#   0.3.1 (pip, when missing), then checks that nvcc is there (/usr/local/cuda) and builds the library.
# torch comes from PyPI: on a machine without a GPU it still imports (GPU tests then skip, with
# the reason); set MLAGEN_TORCH_SPEC (e.g. "torch==2.11.0" or a wheel path) to pin it.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
say() { echo "[setup] $*"; }

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v make >/dev/null || need_apt+=(make)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "apt-get install ${need_apt[*]}"
    apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
  else
    say "missing ${need_apt[*]}: install them (apt-get install ${need_apt[*]}) or run as root"; exit 1
  fi
fi
PY=${PYTHON:-python3}
missing=()
for m in jinja2 pytest numpy; do "$PY" -c "import $m" 2>/dev/null || missing+=("$m"); done
"$PY" -c "import torch" 2>/dev/null || missing+=("${MLAGEN_TORCH_SPEC:-torch}")
# kernelguard: the submission server's third gate, at the version kernelbot pins (tools/bundle.py runs it)
"$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("kernelguard") != "0.3.1")' 2>/dev/null \
  || missing+=("kernelguard==0.3.1")
if [ ${#missing[@]} -gt 0 ]; then
  say "pip install ${missing[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${missing[@]}"
fi
if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; else
    say "nvcc not found: install the CUDA toolkit (12.8+) in /usr/local/cuda"; exit 1; fi
fi
say "$(nvcc --version | tail -1); $(cmake --version | head -1); torch $("$PY" -c 'import torch; print(torch.__version__)')"
make build
# the leaderboard bundles: dist/submission.py (MI355X; its device compiles use the AMD toolchain, which
# `make bundle` sets up: clang-19 from Debian, clang-21 in a Debian sid chroot) and dist/submission_sm90a.py
make bundle bundle-local
say "ready: make test (library build/sm90a/libmlagen.so; bundles dist/submission.py, dist/submission_sm90a.py)"
