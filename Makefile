# mlagen: make (generate + build), make test, make bench, make check-generated
PYTHON ?= python3
ARCH ?= sm90a
BUILD ?= build/$(ARCH)
SHAPES ?=
GEN_ARGS := $(if $(SHAPES),--shapes $(SHAPES))
# extra shapes generate into the build folder: the committed generated/ stays as it is
GEN_DIR := $(if $(SHAPES),$(abspath $(BUILD))/generated,$(abspath generated))
JOBS ?= $(shell nproc)
export MLAGEN_LIBRARY ?= $(abspath $(BUILD)/libmlagen.so)
export PYTHONPATH := $(abspath runtime/python):$(abspath .):$(PYTHONPATH)

.PHONY: amd-device-cc setup gpu-check tune all generate check-generated list build test test-installed test-vllm venv-vllm test-cpu test-gpu bench sanitize clean bundle bundle-local leaderboard-test leaderboard-bench check-amd check-sm90 lib-amd

all: build

# the README's first command on a fresh machine: tools, Python packages, the library
setup:
	PYTHON=$(PYTHON) tools/setup.sh

# GPU-only targets say in one line why they cannot run here (and stop)
gpu-check:
	@$(PYTHON) -c 'import importlib.util as u, sys; t = u.find_spec("torch") is not None; ok = t and __import__("torch").cuda.is_available(); ok or print("$(MAKECMDGOALS): needs torch and a CUDA GPU (" + ("torch sees no GPU" if t else "torch is not installed") + "); nothing was run"); sys.exit(0 if ok else 2)'

generate:
	$(PYTHON) -m codegen generate $(GEN_ARGS) --out $(GEN_DIR)

list:
	$(PYTHON) -m codegen list $(GEN_ARGS)

check-generated:
	$(PYTHON) -m codegen check $(GEN_ARGS)

build: generate
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGEN_ARCH=$(ARCH) -DMLAGEN_GEN_ARGS="$(GEN_ARGS)" \
	  -DMLAGEN_GEN_DIR=$(GEN_DIR) $(CMAKE_EXTRA)
	cmake --build $(BUILD) -j $(JOBS)
	@echo "built $(MLAGEN_LIBRARY)"

# CPU tests always; GPU tests run where a GPU is, and are reported skipped (with the reason) elsewhere.
test: build
	$(PYTHON) -m pytest -q tests

# the tests against the installed package (pip install .), not the checkout: PYTHON is the
# interpreter it was installed for (CI: a fresh virtual environment)
test-installed:
	env -u MLAGEN_LIBRARY PYTHONPATH=$(abspath .) MLAGEN_TEST_INSTALLED=1 $(PYTHON) -m pytest -q tests

# The vLLM plugin (mlagen.integrations.vllm) against the real vLLM, CPU only: its own virtual
# environment (kept, reused while its vLLM imports), `pip install -e .[vllm]` with the CMake
# step skipped (wheel.cmake=false: the extra and the entry point come from pyproject.toml through
# pip, the code from runtime/python; the library is MLAGEN_LIBRARY's), then the tests, which fail
# rather than skip without vLLM (MLAGEN_REQUIRE_VLLM=1). vLLM pins torch (0.33: 2.14, CUDA wheels
# from PyPI, ~5 GB); the kernels never run here, the GPU half is tests/gpu/test_serving.py.
VLLM_VENV ?= build/venv-vllm
# (no pip cache: the wheels would take ~5 GB more of a disk the CI machine shares; a run once stopped
# on "No space left on device" here)
VLLM_PIP = $(VLLM_VENV)/bin/pip --disable-pip-version-check --no-cache-dir
venv-vllm:
	@if ! $(VLLM_VENV)/bin/python -c 'import vllm, pytest' 2>/dev/null; then \
	  set -e; rm -rf $(VLLM_VENV); \
	  free=$$(df -Pk $(dir $(abspath $(VLLM_VENV))) | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  echo "venv-vllm: $$free GB free for ~10 GB"; \
	  if [ "$$free" -lt 11 ]; then echo "venv-vllm: $$free GB free on $(dir $(abspath $(VLLM_VENV))), expected >= 11 GB" >&2; exit 1; fi; \
	  python3 -m venv $(VLLM_VENV); \
	  $(VLLM_PIP) install -q -U pip; \
	  $(VLLM_PIP) install -q -e '.[vllm]' pytest -C wheel.cmake=false; \
	else $(VLLM_PIP) install -q --no-deps -e . -C wheel.cmake=false; fi
	@$(VLLM_VENV)/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'

test-vllm: venv-vllm
	MLAGEN_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -q tests/cpu/test_vllm_plugin.py tests/cpu/test_serving.py

# tests/cpu: no GPU needed; tests/gpu: every test gpu-marked (tests/conftest.py), skipped with the reason without one
test-cpu: build
	$(PYTHON) -m pytest -q tests/cpu

test-gpu: build
	$(PYTHON) -m pytest -q tests/gpu

bench: gpu-check build
	$(PYTHON) bench/bench.py --out bench/results

# measure splits x tiles per catalog shape on the GPU, write codegen/tuning.json, rebuild
tune: gpu-check build
	$(PYTHON) bench/tune.py $(TUNE_ARGS) --log bench/results/tune_log.json
	$(MAKE) build

# results go to build/sanitize; commit one by copying it into bench/results
sanitize: gpu-check build
	$(PYTHON) bench/sanitize.py --out build/sanitize

# ---- the leaderboard bundle ------------------------------------------------------------
# dist/submission.py: the file to submit, MI355X (gfx950), carrying a slim library: only the
# kernels its custom_kernel dispatches to (KV_FORMAT's eight leaderboard kernels and its generic
# kernel), stripped. dist/submission_sm90a.py: the same for the H200, for local tests only.
# tools/bundle.py refuses to write a file that the submission server would refuse.
KV_FORMAT ?= fp8
SUBMIT_ARCH := gfx950
SLIM = build/slim-$(1)-$(KV_FORMAT)
SLIM_GEN_ARGS = --arch $(1) --bundle $(KV_FORMAT)

# The device compiler for AMD: ROCm's clang where ROCm is; without it, clang-21 in the Debian sid chroot
# (tools/amd/setup_toolchains.sh sets it up; tools/amd/hip-device-cc runs it). The host part is g++ either way.
HIP_CLANG_ROUTE = $(if $(shell command -v hipcc),,$(abspath tools/amd/hip-device-cc))
amd-device-cc:
	$(if $(HIP_CLANG_ROUTE),tools/amd/setup_toolchains.sh,@echo "device compiles: ROCm's clang")

# $(call slim_cmake,ARCH): the slim library (NVIDIA; AMD through ROCm's clang or the chroot's)
define slim_cmake
	cmake -S . -B $(call SLIM,$(1)) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGEN_ARCH=$(1) \
	  -DMLAGEN_GEN_DIR=$(abspath $(call SLIM,$(1)))/generated -DMLAGEN_GEN_ARGS="$(call SLIM_GEN_ARGS,$(1))" \
	  -DMLAGEN_LINEINFO=OFF -DMLAGEN_STRIP=ON -DMLAGEN_TORCH_OP=OFF $(if $(filter gfx%,$(1)),$(if $(HIP_CLANG_ROUTE),-DMLAGEN_HIP_CLANG=$(HIP_CLANG_ROUTE)))
	cmake --build $(call SLIM,$(1)) -j $(JOBS)
endef

bundle: $(if $(HIP_CLANG_ROUTE),amd-device-cc)
	$(call slim_cmake,$(SUBMIT_ARCH))
	$(PYTHON) tools/bundle.py --lib $(call SLIM,$(SUBMIT_ARCH))/libmlagen.so --arch $(SUBMIT_ARCH) \
	  --gen-dir $(call SLIM,$(SUBMIT_ARCH))/generated --kv-format $(KV_FORMAT) --out dist/submission.py

bundle-local:
	$(call slim_cmake,sm90a)
	$(PYTHON) tools/bundle.py --lib $(call SLIM,sm90a)/libmlagen.so --arch sm90a --local-test \
	  --gen-dir $(call SLIM,sm90a)/generated --kv-format $(KV_FORMAT) --out dist/submission_sm90a.py

# the leaderboard's method on the local-test bundle, in a fresh process (GPU); dist/submission.py is left alone
leaderboard-test: gpu-check bundle-local
	$(PYTHON) -m bench.leaderboard.harness dist/submission_sm90a.py --mode test --json dist/leaderboard-test.json

leaderboard-bench: gpu-check bundle-local
	$(PYTHON) -m bench.leaderboard.harness dist/submission_sm90a.py --mode leaderboard --seed-peer --json dist/leaderboard-bench.json

# AMD: compile-check every generated gfx942/gfx950 kernel and inspect its assembly (MFMA
# present, no spills); toolchains: Debian clang-19 (gfx942) and clang-21 in a sid chroot.
# sm_90a, no GPU: every warpgroup / rows-body kernel through ptxas -v; no C75xx (serialized
# wgmmas), no spills beyond tools/check_sm90.py's KNOWN_SPILLS
check-sm90:
	$(PYTHON) tools/check_sm90.py --sources generated --out build/sm90-check --jobs $(JOBS)

check-amd:
	tools/amd/setup_toolchains.sh
	$(PYTHON) tools/amd/check_amd.py --sources generated --out build/amd-check

# An AMD fat library (every generated kernel of ARCH=gfx950 or gfx942): `make build ARCH=...` on a ROCm
# machine; here, through the chroot's clang (the host part needs no ROCm, so it loads on any Linux).
lib-amd: amd-device-cc
	@case "$(ARCH)" in gfx950|gfx942) ;; *) echo "lib-amd: ARCH=gfx950 or gfx942"; exit 2 ;; esac
	$(MAKE) build ARCH=$(ARCH) CMAKE_EXTRA="$(if $(HIP_CLANG_ROUTE),-DMLAGEN_HIP_CLANG=$(HIP_CLANG_ROUTE))"

clean:
	rm -rf build dist
