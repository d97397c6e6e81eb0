# mlagen: make (generate + build), make test, make bench, make check-generated
PYTHON ?= python3
ARCH ?= sm90a
BUILD ?= build/$(ARCH)
SHAPES ?=
GEN_ARGS := --arch $(ARCH) $(if $(SHAPES),--shapes $(SHAPES))
JOBS ?= $(shell nproc)
export MLAGEN_LIBRARY ?= $(abspath $(BUILD)/libmlagen.so)
export PYTHONPATH := $(abspath runtime/python):$(abspath .):$(PYTHONPATH)

.PHONY: all generate check-generated list build test test-cpu test-gpu bench sanitize clean

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

sanitize: build
	$(PYTHON) bench/sanitize.py

clean:
	rm -rf build dist
