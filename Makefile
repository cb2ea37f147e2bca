# Kiln's entry points. The README's two commands are `make image` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KILN := $(BIN)/kiln

.PHONY: setup image test unit lint bench bench-runners release clean

$(BIN)/kiln: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(BIN)/kiln
	./scripts/setup-host.sh

# Kiln's main job. Until profiles and the ISO/disk outputs land this builds the first bootable
# output: the kernel and the initramfs (tiny init + read-only squashfs rootfs with machined),
# building every package they need through the graph, into _out/image/.
image: setup
	$(KILN) validate
	$(KILN) image --output kernel,initramfs --out _out/image

test: setup
	$(BIN)/pytest -q

unit: $(BIN)/kiln
	$(BIN)/pytest -q tests/unit

lint: $(BIN)/kiln
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

bench: $(BIN)/kiln
	$(BIN)/python bench/graph.py
	$(BIN)/python bench/build.py

# sandbox vs docker vs buildkit; needs dockerd (scripts/ci-services.sh starts it)
bench-runners: $(BIN)/kiln
	$(BIN)/python bench/runners.py

clean:
	rm -rf $(VENV) _out .pytest_cache .mypy_cache .ruff_cache
