# Kiln's entry points. The README's two commands are `make image` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KILN := $(BIN)/kiln
# What .venv installs besides Kiln: the test tools (and matplotlib, which the tests draw with) by
# default; setup-image installs none of them.
EXTRAS ?= [test]

.PHONY: setup setup-image services image test go-test unit lint bench bench-runners release clean

$(BIN)/kiln: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.$(EXTRAS)'
	touch $@

# The host tools first: on a fresh Debian (a CI job's debian:12 container) python3-venv comes from them.
setup:
	./scripts/setup-host.sh
	$(MAKE) --no-print-directory $(BIN)/kiln

# Only what building packages and making the metal and iso images needs, not the tests' tools
# (QEMU system emulators, firmware, swtpm, signing tools, ...): docs/ci.md's image jobs.
setup-image:
	./scripts/setup-host.sh --image
	$(MAKE) --no-print-directory $(BIN)/kiln EXTRAS=

# Kiln's main job: the default image, a bare-metal raw disk (profiles/metal.yaml) and the live ISO
# (profiles/iso.yaml), building every package they need through the graph, into _out/metal/ and
# _out/iso/. `kiln boot _out/metal/metal-amd64.raw.zst` boots it.
image: setup
	$(KILN) validate
	$(KILN) image metal iso --out _out

# A release: every shipped profile, built with the full bootstrapped `toolchain` (binutils + gcc +
# musl from source, 14 minutes cold on 2 idle cores) instead of CI's quick toolchain-seed. With
# RELEASE_KEYS=DIR (kiln keys generate DIR), each profile's directory is signed with DIR's release
# key: SHA256SUMS.sig, and the provenance as a DSSE envelope (docs/provenance.md); `kiln verify`
# checks both.
RELEASE_PROFILES := $(basename $(notdir $(wildcard profiles/*.yaml)))
RELEASE_KEYS ?=
release: setup
	$(KILN) validate --set toolchain=toolchain
	$(KILN) image $(RELEASE_PROFILES) --set toolchain=toolchain --out _release $(if $(RELEASE_KEYS),--keys $(RELEASE_KEYS))
	$(if $(RELEASE_KEYS),,@echo "make release: not signed; RELEASE_KEYS=DIR signs it with DIR's release key")

# Everything the tests need runs first: the host tools (setup), and the Docker engine and OCI
# registry the runner, cache and installer tests use (services). Then two lanes at once
# (scripts/test_lanes.py): the QEMU boots (tests/e2e), and beside them, niced, the unit and
# integration tests; machined's Go tests (go-test) start when the first of the two ends.
test: setup services
	$(BIN)/python scripts/test_lanes.py $(BIN)/python

# machined's Go tests under the race detector (which needs cgo: gcc and libc6-dev), then its
# fuzz targets.
go-test:
	cd runtime/machined && CGO_ENABLED=1 go test -race ./...
	cd runtime/machined && for target in $(GO_FUZZ); do \
		go test -run='^$$' -fuzz="^$${target#*:}$$" -fuzztime=$(FUZZTIME) ./$${target%%:*} || exit 1; \
	done

# machined's fuzz targets, PACKAGE:Target (PACKAGE . is machined itself), each run FUZZTIME.
GO_FUZZ := internal/yaml:FuzzParseYAML .:FuzzParseConfig internal/bootstate:FuzzParse \
	internal/oci:FuzzParseReference internal/oci:FuzzUnpack internal/dhcp:FuzzParseLease \
	internal/platform:FuzzParse internal/ntp:FuzzParsePacket internal/dhcp6:FuzzParseDHCP6 \
	.:FuzzClientIdentity .:FuzzGrubCmdline internal/redact:FuzzRedact internal/network:FuzzLinkLocalRoutes \
	internal/oci:FuzzParseContentRange internal/oci:FuzzVerifySignature internal/oci:FuzzParsePublicKeyPEM
FUZZTIME ?= 13s

# The Docker engine and the OCI registry on 127.0.0.1:5000 (installed and started if missing).
services:
	./scripts/ci-services.sh

unit: $(BIN)/kiln
	$(BIN)/pytest -q tests/unit

lint: $(BIN)/kiln
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy
	$(BIN)/mypy tests bench scripts
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/python scripts/rooms.py --check
	cd runtime/machined && unformatted=$$(gofmt -l .) && [ -z "$$unformatted" ] || { echo "gofmt: $$unformatted" >&2; exit 1; }
	cd runtime/machined && go vet ./...

bench: $(BIN)/kiln
	$(BIN)/python bench/graph.py
	$(BIN)/python bench/build.py

# sandbox vs docker vs buildkit; needs dockerd (scripts/ci-services.sh starts it)
bench-runners: $(BIN)/kiln
	$(BIN)/python bench/runners.py

clean:
	rm -rf $(VENV) _out _release .pytest_cache .mypy_cache .ruff_cache
