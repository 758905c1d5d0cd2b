# rayscope — the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

# Ray ignores --node-ip-address=127.0.0.1 without this (docs/architecture.md): every process that
# starts or talks to a test cluster needs it.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup test test-fast lint demo golden schema lock clean bench fuzz bench-agents

setup: $(STAMP)  ## .venv with rayscope (editable), ray and the test tools, pinned by constraints.txt

# Editable through hatchling: a .pth line naming agent/ (pyproject.toml's dev-mode-dirs), a
# plain path entry and no import-hook finder, which would cost every Python started in .venv
# ~15 ms (the CLI's start-up is benchmarked against ray status).
$(STAMP): pyproject.toml constraints.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -r requirements-dev.txt \
		-e '.[ray]'
	touch $@

test: setup  ## the whole suite, live Ray cluster included, after installing the Debian packages it needs (make debian-deps)
	$(PYTHON) -m tests.debian_deps --keep-going
	$(BIN)/python -m pytest

test-fast: setup  ## the inner loop: no live cluster, not the slowest files (make test runs everything)
	$(BIN)/python -m pytest -q -m "not live and not slow"

.PHONY: install-ends
install-ends: setup  ## `pip install .` in two fresh venvs, the newest and the lowest versions pyproject.toml allows: --version, every --help, the tests of the dependencies, the GCS read via the Ray node's Python
	$(BIN)/python -m tests.tools.install_ends

lint: setup  ## ruff + mypy (strict)
	$(BIN)/ruff check agent tests build
	$(BIN)/ruff format --check agent tests build
	$(BIN)/mypy

demo: setup  ## a Ray cluster on 127.0.0.1, the seed's bookings, `rayscope status`, then stop (KEEP=1: up until Ctrl-C, with commands to try)
	$(BIN)/python tests/livecluster.py demo $(if $(KEEP),--keep)

# Debian packages some tests run besides .venv (`make setup` installs none of them), listed
# command by command in tests/debian_deps.py: prometheus (promtool, prometheus), chromium,
# systemd (systemd-analyze), bubblewrap (bwrap), iproute2 (ip), gcc (cc, for the fake NVML).
# Only the missing ones are installed, with apt-get as root or with sudo: nothing to do, no apt,
# when all are on PATH. `make test` runs it first and goes on where a package cannot be had:
# each test that needs it then fails naming the package and the command that installs it.
.PHONY: debian-deps
debian-deps:  ## Debian packages the tests need beyond .venv (prometheus, chromium, systemd, bubblewrap, iproute2, gcc), as root or with sudo; nothing when all are there
	$(PYTHON) -m tests.debian_deps

# Every test file that checks a golden (calls check_golden), found rather than listed: a list
# by hand left tests/test_vgpu.py's nine goldens out of `make golden`.
GOLDEN_TESTS = $(shell grep -l check_golden tests/test_*.py)

golden: setup  ## rewrite tests/golden/ from the renderers; review the diff
	RAYSCOPE_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q -m "not live" $(GOLDEN_TESTS)

schema: setup  ## rewrite schema/*.schema.json from the msgspec Structs (tests/schemas.py); review the diff
	$(BIN)/python -m tests.schemas

lock:  ## re-pin constraints.txt from requirements-dev.txt in a scratch venv
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -r requirements-dev.txt -e '.[ray]'
	{ head -2 constraints.txt; .lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

fuzz: setup  ## 100,000 generated inputs to the head's frame and report decoders: none unhandled, every rejection counted -> RELIABILITY.md
	mkdir -p $(RELIABILITY_DIR)
	$(BIN)/python -m tests.tools.fuzz_wire 100000 $${FUZZ_SEED:-0} --json $(RELIABILITY_DIR)/fuzz.json; rc=$$?; \
	$(BIN)/python -m tests.tools.reliability --fuzz $(RELIABILITY_DIR)/fuzz.json --out RELIABILITY.md; exit $$rc

bench: setup  ## the head agent's figures against peers, written to BENCHMARKS.md
	$(BIN)/python -m tests.tools.bench

bench-agents: setup  ## add_node -> first report from its Ray-placed agent, vs a plain actor, into BENCHMARKS.md
	$(BIN)/python -m tests.tools.bench_agents

.PHONY: pyz pyz-lock pyz-bench compat compat-ends

pyz: setup  ## dist/rayscope.pyz + .sha256: one file for CPython 3.9-3.13 on Linux x86_64 and aarch64
	$(BIN)/python build/pyz.py build

pyz-lock: setup  ## re-resolve build/pyz-lock.txt, the zipapp's runtime closure with hashes
	$(BIN)/python build/pyz.py lock

pyz-bench: pyz  ## cold and warm start of dist/rayscope.pyz under every CPython 3.8-3.13 found here
	$(BIN)/python build/bench.py dist/rayscope.pyz

.PHONY: reliability soak

RELIABILITY_DIR := .reliability
SOAK_AGENTS     ?= 2000
SOAK_SECONDS    ?= 60
SOAK_CAP_S      ?= 600

soak: setup  ## 2,000 simulated agents push for 60 s to one head (capped at 10 min) -> RELIABILITY.md
	mkdir -p $(RELIABILITY_DIR)
	timeout $(SOAK_CAP_S) $(BIN)/python -m tests.tools.soak run --agents $(SOAK_AGENTS) --seconds $(SOAK_SECONDS) \
		--out $(RELIABILITY_DIR)/soak.json; rc=$$?; \
	$(BIN)/python -m tests.tools.reliability --faults $(RELIABILITY_DIR)/faults.jsonl \
		--fuzz $(RELIABILITY_DIR)/fuzz.json --soak $(RELIABILITY_DIR)/soak.json --out RELIABILITY.md; exit $$rc

reliability: setup  ## every fault test (pytest -m fault), the 100,000-input fuzz, then the soak -> RELIABILITY.md
	mkdir -p $(RELIABILITY_DIR) && rm -f $(RELIABILITY_DIR)/faults.jsonl $(RELIABILITY_DIR)/fuzz.json $(RELIABILITY_DIR)/soak.json
	RAYSCOPE_RELIABILITY_JSON=$(CURDIR)/$(RELIABILITY_DIR)/faults.jsonl $(BIN)/python -m pytest -m fault -q; \
	rc=$$?; $(MAKE) fuzz || rc=1; $(MAKE) soak || rc=1; exit $$rc

compat: pyz  ## dist/rayscope.pyz under a venv per Ray 2.33.0-2.60.0 (cached in ~/.cache/rayscope-compat), table into docs/ray-releases.md
	$(BIN)/python -m tests.tools.compat --readme

compat-ends: pyz  ## the same for the oldest and the newest Ray only (CI, every change)
	$(BIN)/python -m tests.tools.compat --ends
