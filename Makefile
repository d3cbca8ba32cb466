# ropelab: one command for tests, one for figures. Everything installs into .venv from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
# Override for another build, e.g. `make test TORCH_SPEC="torch==2.5.1"`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= notebooks,dev
JOBS ?= 2

.PHONY: setup test lint figures figures-smoke lab bench lm clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check ropelab tests notebooks

test: lint
	$(PY) -m pytest -n $(JOBS)

figures: setup
	$(PY) -m ropelab.figures

figures-smoke: setup
	$(PY) -m ropelab.figures --smoke --jobs $(JOBS)

lab: setup
	$(VENV)/bin/jupyter lab notebooks

bench: setup
	$(PY) -m ropelab.bench cpu
	$(PY) -m ropelab.bench decode

# Retrain notebook 05's language model (about 20 minutes on 2 cores) and re-evaluate it.
lm: setup
	$(PY) -m ropelab.lm corpus
	$(PY) -m ropelab.lm train --threads 2
	$(PY) -m ropelab.lm eval

clean:
	rm -rf build .pytest_cache .hypothesis
