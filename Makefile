# mlagen: make (generate + build), make test, make bench, make check-generated
PYTHON ?= python3
ARCH ?= sm90a
BUILD ?= build/$(ARCH)
SHAPES ?=
GEN_ARGS := $(if $(SHAPES),--shapes $(SHAPES))
JOBS ?= $(shell nproc)
export MLAGEN_LIBRARY ?= $(abspath $(BUILD)/libmlagen.so)
export PYTHONPATH := $(abspath runtime/python):$(abspath .):$(PYTHONPATH)

.PHONY: tune all generate check-generated list build test test-cpu test-gpu bench sanitize clean bundle leaderboard-test leaderboard-bench check-amd lib-amd bundle-amd

all: build

generate:
	$(PYTHON) -m codegen generate $(GEN_ARGS)

list:
	$(PYTHON) -m codegen list $(GEN_ARGS)

check-generated:
	$(PYTHON) -m codegen check $(GEN_ARGS)

build: generate
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGEN_ARCH=$(ARCH) -DMLAGEN_GEN_ARGS="$(if $(SHAPES),--shapes $(SHAPES))"
	cmake --build $(BUILD) -j $(JOBS)
	@echo "built $(MLAGEN_LIBRARY)"

# CPU tests always; GPU tests run where a GPU is, and are reported skipped (with the reason) elsewhere.
test: build
	$(PYTHON) -m pytest -q tests

test-cpu: build
	$(PYTHON) -m pytest -q tests -m "not gpu"

test-gpu: build
	$(PYTHON) -m pytest -q tests -m gpu

bench: build
	$(PYTHON) bench/bench.py --out bench/results

# measure splits x tiles per catalog shape on the GPU, write codegen/tuning.json, rebuild
tune: build
	$(PYTHON) bench/tune.py $(TUNE_ARGS) --log bench/results/tune_log.json
	$(MAKE) build

sanitize: build
	$(PYTHON) bench/sanitize.py

KV_FORMAT ?= fastest
# The library a bundle embeds: CMake for NVIDIA and for AMD on a ROCm machine (hipcc
# found); without ROCm, an AMD library comes from the sid chroot toolchain (lib-amd).
LIB_TARGET := $(if $(filter gfx%,$(ARCH)),$(if $(shell command -v hipcc),build,lib-amd),build)

# dist/submission.py: the one-file leaderboard entry for ARCH, library embedded (see README)
bundle: $(LIB_TARGET)
	$(PYTHON) tools/bundle.py --lib $(BUILD)/libmlagen.so --arch $(ARCH) --kv-format $(KV_FORMAT) --out dist/submission.py

# the leaderboard's method on the bundle, in a fresh process (GPU)
leaderboard-test: bundle
	$(PYTHON) -m tests.leaderboard.harness dist/submission.py --mode test --json dist/leaderboard-test.json

leaderboard-bench: bundle
	$(PYTHON) -m tests.leaderboard.harness dist/submission.py --mode benchmark --seed-peer --json dist/leaderboard-bench.json

# AMD: compile-check every generated gfx942/gfx950 kernel and inspect its assembly (MFMA
# present, no spills); toolchains: Debian clang-19 (gfx942) and clang-21 in a sid chroot.
check-amd:
	tools/amd/setup_toolchains.sh
	$(PYTHON) tools/amd/check_amd.py --sources generated --out build/amd-check

# The gfx950 fat library without ROCm, through the sid chroot (clang-21 + libamdhip64).
# On a ROCm machine use `make build ARCH=gfx950` (CMake's HIP language) instead.
lib-amd:
	@case "$(ARCH)" in gfx950) ;; *) echo "lib-amd: ARCH=gfx950 (the chroot route links gfx950)"; exit 2 ;; esac
	tools/amd/setup_toolchains.sh
	mkdir -p build/$(ARCH) && cp runtime/src/runtime.cpp build/$(ARCH)/runtime.hip
	tools/amd/link_gfx950.sh --dlopen-check -o build/$(ARCH)/libmlagen.so \
	  -DMLAGEN_BUILD_ARCH='"$(ARCH)"' -DMLAGEN_BUILD_$(shell echo $(ARCH) | tr a-z A-Z)=1 \
	  build/$(ARCH)/runtime.hip $(sort $(wildcard generated/mla_decode_$(ARCH)_*.hip))

# dist/submission_$(ARCH).py from the chroot-built AMD library (kept beside the NVIDIA bundle)
bundle-amd: lib-amd
	$(PYTHON) tools/bundle.py --lib build/$(ARCH)/libmlagen.so --arch $(ARCH) --kv-format $(KV_FORMAT) --out dist/submission_$(ARCH).py

clean:
	rm -rf build dist
