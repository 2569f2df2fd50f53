# cart_sweeps: `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU wheel on a fresh machine; a torch that is already importable (e.g. a GPU user's CUDA build) is kept.
TORCH_VERSION ?= 2.13.0
# pytest-xdist workers: 2 on 2 cores take the fast tier 374 s -> 164-195 s (tests wait on processes they start);
# the quick demo's readers and the SLURM tests each keep to one worker (tests/conftest.py).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
# The slow tier's tests wait more (on SLURM's queue, on runs they kill, on stages of several processes): a third
# worker fills the core a SLURM test leaves idle; a fourth took it from 1,809 s to 1,904 s (the cores were full).
SLOW_WORKERS ?= 3

.PHONY: help setup demo test test-full pins fuzz lint tables clean gpu-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -v torch='$(TORCH_VERSION)' -F':.*## ' \
		'{gsub(/\$$\(TORCH_VERSION\)/, torch, $$2); printf "  make %-9s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	@$(PY) -m pip install -q -e ".[dev]"
	@touch $@

setup: $(VENV)/.installed ## create .venv: torch $(TORCH_VERSION) unless one is importable, then the project [dev]

demo: setup ## the tiny study end to end on the embedded corpus, ending in tables
	$(PY) -m cart_sweeps.demo

test: setup ## the fast tier (~2 min on 2 cores): units, and narrowed stages through the real entry points
	$(PYTEST) -m "not slow"

# test-full: both tiers read one data cache (tests/conftest.py `data_cache`), so the corpus is tokenized once.
test-full: setup ## all tests: the fast tier, then the slow one (demo, faults in real stages, SLURM: tests/slurm)
	export CART_TEST_DATA_CACHE=$$(mktemp -d) && $(PYTEST) -m "not slow" && \
		$(PY) -m pytest -q -n $(SLOW_WORKERS) --dist loadgroup -m slow --durations=20

pins: ## the third-party ranges at both ends: fresh venvs of the lowest and highest releases run the adapters' tests
	bash tests/pins/check.sh

# `make fuzz`: stage files drawn at random (tests/test_generated.py, its long profile), hours on 2 cores;
# the seed is printed first, and FUZZ_SEED=<it> replays the same examples; FUZZ_EXAMPLES=N draws N (300).
ifndef FUZZ_SEED  # drawn once: a deferred ?= would draw again where the command uses it
FUZZ_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
FUZZ_EXAMPLES ?= 300
FUZZ_TEST := test_a_generated_study_runs_relaunches_and_tables_what_its_runs_say

fuzz: setup ## generated studies at length (hundreds of drawn stage files, hours): FUZZ_SEED=N replays a run
	@echo "make fuzz FUZZ_SEED=$(FUZZ_SEED)"
	HYPOTHESIS_PROFILE=long FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:xdist tests/test_generated.py::$(FUZZ_TEST) \
		--hypothesis-seed=$(FUZZ_SEED) --hypothesis-show-statistics

gpu-check: setup ## on a CUDA machine: CUDA tests, bench d=256..1024 with/without compile, two runs on one GPU
	$(PY) -m cart_sweeps.gpu_check

lint: setup ## ruff (lint, format), mypy and the layers (lint-imports); pre-commit runs the same
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

tables: setup ## regenerate tables, figures and findings from the runs under runs/
	$(PY) -m cart_sweeps.analysis

clean: ## remove runs, caches and analysis outputs (not .venv)
	rm -rf runs .cache analysis/out
