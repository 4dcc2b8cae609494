# The two commands: `make demo` and `make test`. Each sets everything up itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: setup demo test test-all lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# CPU torch first (it lies on disk here); a resolver must never pull a CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[all]"
	# Installed without their dependency pins (see docs/DESIGN notes in README).
	$(PIP) install --quiet --no-deps "pyserini==1.6.0" "bfcl-eval==2026.3.23"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not gpu"

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) scripts/bench/snapshot.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
