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
	$(VENV)/bin/ruff check trainer sidecars tests bench
	$(VENV)/bin/ruff format --check trainer sidecars tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/bench_events.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
