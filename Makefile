# mlagen: make (generate + build), make test, make bench, make check-generated
PYTHON ?= python3
ARCH ?= sm90a
BUILD ?= build/$(ARCH)
SHAPES ?=
GEN_ARGS := $(if $(SHAPES),--shapes $(SHAPES))
JOBS ?= $(shell nproc)
export MLAGEN_LIBRARY ?= $(abspath $(BUILD)/libmlagen.so)
export PYTHONPATH := $(abspath runtime/python):$(abspath .):$(PYTHONPATH)

.PHONY: tune all generate check-generated list build test test-cpu test-gpu bench sanitize clean bundle leaderboard-test leaderboard-bench

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
	$(PYTHON) bench/tune.py --log bench/results/tune_log.json
	$(MAKE) build

sanitize: build
	$(PYTHON) bench/sanitize.py

KV_FORMAT ?= fp8
# dist/submission.py: the one-file leaderboard entry, library embedded (see README)
bundle: build
	$(PYTHON) tools/bundle.py --lib $(BUILD)/libmlagen.so --arch $(ARCH) --kv-format $(KV_FORMAT) --out dist/submission.py

# the leaderboard's method on the bundle, in a fresh process (GPU)
leaderboard-test: bundle
	$(PYTHON) -m tests.leaderboard.harness dist/submission.py --mode test --json dist/leaderboard-test.json

leaderboard-bench: bundle
	$(PYTHON) -m tests.leaderboard.harness dist/submission.py --mode benchmark --seed-peer --json dist/leaderboard-bench.json

clean:
	rm -rf build dist
