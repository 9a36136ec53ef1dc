# `make train` and `make test` are all a new user needs: both create the environment first.
.DEFAULT_GOAL := help
SHELL := bash
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
RUN := $(UV) run --frozen --no-sync
CONFIG ?= configs/digits.yaml
# Test files run in parallel, one worker per core (at most 4), each file's tests in one worker so
# they share its module fixtures.
PYTEST := $(RUN) pytest -n auto --maxprocesses=4 --dist loadfile

.PHONY: help install train test test-fast fuzz lint format mlflow-ui rename clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

.tools/bin/uv:
	python3 -m venv .tools && .tools/bin/pip install --quiet "uv>=0.5"

.venv/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked
	@touch $@

install: .venv/.installed ## create .venv from uv.lock (installs uv first if missing)

train: install ## train the offline default (digits), then test its best checkpoint
	$(RUN) python -m proj fit --config $(CONFIG)

test: install ## the whole test suite (what CI runs)
	$(PYTEST)

test-fast: install ## the edit loop: skips tests marked slow
	$(PYTEST) -m "not slow"

# The fuzzers of tests/test_fuzz*.py at length: `make test` runs 500 cases of each, this many.
FUZZ_EXAMPLES ?= 5000
fuzz: install ## the fuzzers with many more cases (FUZZ_EXAMPLES=5000)
	PROJ_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(RUN) pytest -n 0 tests/test_fuzz*.py

lint: install ## ruff lint and format check
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: install ## apply ruff's fixes and formatting
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

# The full mlflow (its server and UI, 300 MB) at the version of the locked client, whose store schema
# it must match, in an environment of uv's own: .venv keeps only the client.
mlflow-ui: install ## MLflow's UI on the runs logged with configs/logger/mlflow.yaml (http://127.0.0.1:5000)
	version=$$($(RUN) python -c "from importlib.metadata import version; print(version('mlflow-skinny'))") && \
		$(RUN) --with "mlflow==$$version" mlflow ui --backend-store-uri sqlite:///runs/mlflow/mlflow.db

rename: | $(UV) ## rename the package everywhere: make rename NAME=mynewproject (then re-locks)
	python3 scripts/rename.py "$(NAME)"
	$(UV) lock

clean: ## remove the environment, caches and runs/ (data/ is kept)
	rm -rf .venv .tools .pytest_cache .ruff_cache runs lightning_logs
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
