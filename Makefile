# Two entry points (README): `make demo` runs a local swarm, `make test` runs the suite.
# Both create .venv and install exactly the versions in deploy/constraints.txt (what the suite
# passed with; the image installs the same file), with uv ($(UV), kept in .venv/installer, off
# the venv's path: ~20 s where pip took ~100 s of a fresh clone's CI run). torch stays the user's choice: on a CPU
# machine torch==2.13.0 resolves to the CPU build; if torch is already in .venv (e.g. a CUDA
# build you installed), it is kept.
#
# `make pins` is the one way to move to newer releases: a scratch venv with the newest
# releases pyproject.toml allows, the whole suite on it, and only if it passes, a new
# deploy/constraints.txt (review the diff, commit it).
PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
UV ?= uv==0.13.8
BIN := $(VENV)/bin
NODES ?= 3
ROUNDS ?= 150
CONSTRAINTS := deploy/constraints.txt
PINS_VENV ?= .venv-pins

.PHONY: setup test demo pins clean python-check

# The Python versions the pins were made and the suite passed on (README "Two commands").
python-check:
	@$(PY) deploy/python_check.py

$(BIN)/python:
	@$(PY) deploy/python_check.py
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml $(CONSTRAINTS)
	@$(BIN)/python deploy/python_check.py
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install --quiet --upgrade --target $(VENV)/installer "$(UV)"
	@# --compile-bytecode as pip does: else cellpylib (reasoning_gym) compiles at import, where
	@# the suite's filterwarnings=error turns its SyntaxWarning into a SyntaxError
	$(VENV)/installer/bin/uv pip install --compile-bytecode --python $(BIN)/python -c $(CONSTRAINTS) -e ".[test]"
	touch $@

setup: $(VENV)/.installed

# the suite as two concurrent pytest sessions (tests/lanes.py); plain pytest runs it in one
test: setup
	$(BIN)/python -m tests.lanes

demo: setup
	$(BIN)/swarm-node local --nodes $(NODES) --rounds $(ROUNDS) --report swarm-report.json

pins:
	PY=$(PY) TORCH="$(TORCH)" PINS_VENV=$(PINS_VENV) bash deploy/refresh_pins.sh

clean:
	rm -rf $(VENV) $(PINS_VENV) *.egg-info
