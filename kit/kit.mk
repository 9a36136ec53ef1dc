# The kit's make targets: the template's machinery (environment, the kit's tests, the local cluster,
# lint, rename, upgrade-kit, clean), included by the project's Makefile (`include kit/kit.mk`) and
# replaced with the kit by `make upgrade-kit`. The Makefile keeps the project's own targets (train,
# test, test-fast), which use the variables below (RUN, PYTEST).
SHELL := bash
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
RUN := $(UV) run --frozen --no-sync
# Test files run in parallel, one worker per core (at most 4; a third worker on 2 cores made the
# suite slower), each file's tests in one worker so they share its module fixtures; in file order
# (starting the longest files first made it slower: 797 s against 691 s), except for `make
# test-shuffled`. The 20 slowest are listed at the end, against the 10-minute budget of `make test`.
XDIST := -n auto --maxprocesses=4 --dist loadfile
PYTEST_ANY_ORDER := $(RUN) pytest $(XDIST) --durations=20
PYTEST := $(PYTEST_ANY_ORDER) -p no:randomly

.PHONY: install test-kit test-shuffled test-compat test-cluster fuzz cluster cluster-stop lint format mlflow-ui rename upgrade-kit clean

.tools/bin/uv:
	python3 -m venv .tools && .tools/bin/pip install --quiet "uv>=0.5"

.venv/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked
	@touch $@

install: .venv/.installed ## create .venv from uv.lock (installs uv first if missing)

# The kit's own tests run on a tiny project of their own (kit/tests/tinyproj), with kit/pyproject.toml's
# pytest settings: the kit is tested as it ships, whatever this project's code is.
test-kit: install ## the kit's tests (kit/tests): the CLI, checks, resume, preemption, DDP, sweeps, export
	$(PYTEST) kit/tests

# The tests marked `cluster` (which `make test` and `make test-kit` leave out) submit jobs to the local
# cluster, four at a time, as most of their time is waiting: the kit's (kit/tests/test_cluster.py says
# how they are dealt to the workers) and, beside them, this project's (tests/test_cluster.py runs its
# documented job lines; its output follows the kit's; a project without cluster tests, pytest's exit
# code 5, passes). A cluster that does not start fails here, with its message. It has two nodes, for
# the job that spans both.
test-cluster: export NODES = 2
test-cluster: export SLURM_CONF = $(CURDIR)/.cluster/slurm/slurm.conf
test-cluster: install cluster ## the Slurm and PostgreSQL tests, on a local cluster of two nodes (starts it)
	$(RUN) pytest -p no:randomly -m cluster -n 2 --dist load tests >.cluster/test-project.log 2>&1 & \
	project=$$!; \
	$(RUN) pytest -p no:randomly -m cluster -n 4 --dist load kit/tests; kit=$$?; \
	wait $$project; project=$$?; cat .cluster/test-project.log; \
	test $$kit = 0 && { test $$project = 0 || test $$project = 5; }

cluster: ## start a Slurm cluster of NODES nodes (default 1) and a PostgreSQL server here (.cluster/; prints the --storage URL)
	kit/scripts/cluster.sh start

cluster-stop: ## stop what `make cluster` started
	kit/scripts/cluster.sh stop

# A test that passes only in one order, or at one thread count, fails here. pytest-randomly prints
# the seed it shuffled with; `make test-shuffled SEED=N` repeats that order; SUITES=kit/tests shuffles
# the kit's alone.
SUITES ?= tests kit/tests
test-shuffled: install ## the fast tests of both suites again at 2 threads a process, in a random order
	for suite in $(SUITES); do \
	  OMP_NUM_THREADS=2 $(PYTEST_ANY_ORDER) -m "not slow" $(if $(SEED),--randomly-seed=$(SEED)) $$suite || exit 1; \
	done

# The ranges kit/pyproject.toml declares, tested at both ends: the kit's fast tests in .compat/lowest
# (every direct dependency of the kit and of the project at the lowest version its range allows) and
# in .compat/newest (the newest the registry has), torch, torchvision and the test tools held at
# uv.lock's versions; a table of the versions each got and its result ends it. An environment is
# synced only when what it resolves to changed (kit/scripts/compat.py says how).
test-compat: install ## the kit's fast tests with its dependencies at the lowest and the newest versions their ranges allow
	UV=$(UV) $(RUN) python kit/scripts/compat.py -- $(XDIST) -p no:randomly

# The fuzzers at length: the kit's (kit/tests/test_fuzz*.py: config values, checkpoint state, kill
# times, sweep files, names, ...; test_preprocessing.py: preprocessing specs and files; test_serve.py: a
# server's bad requests) and this project's (tests/test_fuzz*.py: image-folder trees, where it has
# them). `make test` and `make test-kit` run a few hundred cases of each (a few kills); this runs
# FUZZ_EXAMPLES of each.
FUZZ_EXAMPLES ?= 5000
fuzz: install ## the fuzzers with many more cases (FUZZ_EXAMPLES=5000)
	PROJ_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(RUN) pytest -n 0 kit/tests/test_fuzz*.py kit/tests/test_preprocessing.py
	PROJ_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(RUN) pytest -n 0 kit/tests/test_serve.py -k fuzz
	$(if $(wildcard tests/test_fuzz*.py),PROJ_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(RUN) pytest -n 0 $(wildcard tests/test_fuzz*.py))

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
	python3 kit/scripts/rename.py "$(NAME)"
	$(UV) lock

# The kit (kit/) is the template's machinery: replaced whole by another version's, never merged, so
# an upgrade cannot conflict. Then uv.lock is made again and TESTS (default: test) run.
#   make upgrade-kit                                 # the newest release, from the remote `template` (else `origin`)
#   make upgrade-kit VERSION=1.1.0                   # a release; REF=<branch, tag or commit> for any other
#   make upgrade-kit FROM=https://github.com/<owner>/<template>.git
# OVERWRITE=1 replaces a kit/ with local changes (lost); DOWNGRADE=1 takes an older kit. A kill
# leaves the old kit or the new one, and the next upgrade-kit finishes it (kit/docs/upgrading.md).
TESTS ?= test
upgrade-kit: | $(UV) ## replace kit/ with the template's newest release (VERSION=, REF=, FROM=), relock, test
	UV=$(UV) python3 kit/scripts/upgrade.py $(if $(REF),"$(REF)") $(if $(VERSION),--version "$(VERSION)") \
		$(if $(FROM),--from "$(FROM)") --tests "$(TESTS)" $(if $(OVERWRITE),--overwrite) $(if $(DOWNGRADE),--downgrade)

clean: cluster-stop ## remove the environments, caches, runs/ and .cluster/ (data/ is kept)
	rm -rf .cluster .compat .venv .tools .pytest_cache .ruff_cache runs lightning_logs
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
