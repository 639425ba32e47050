# Two entry points (README): `make demo` runs a local swarm, `make test` runs the suite.
# Both create .venv and install what they need. On a CPU machine torch==2.13.0 resolves to
# the CPU build; if torch is already in .venv (e.g. a CUDA build you installed), it is kept.
PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
NODES ?= 3
ROUNDS ?= 5

.PHONY: setup test demo clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed

test: setup
	$(BIN)/python -m pytest

demo: setup
	$(BIN)/swarm-node local --nodes $(NODES) --rounds $(ROUNDS) --report swarm-report.json

clean:
	rm -rf $(VENV) *.egg-info
