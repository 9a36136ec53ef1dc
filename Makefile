# `make train` and `make test` are all a new user needs: both create the environment first. This
# file holds the project's own targets; the kit's (install, test-kit, lint, cluster, rename,
# upgrade-kit, clean, ...) are in kit/kit.mk, which comes with the kit. `make help` lists both.
.DEFAULT_GOAL := help
CONFIG ?= configs/digits.yaml

include kit/kit.mk

.PHONY: help train test test-fast

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

train: install ## train the offline default (digits), then test its best checkpoint
	$(RUN) python -m proj fit --config $(CONFIG)

test: install ## this project's tests (tests/): its configs, models, data, README and notebooks
	$(PYTEST)

test-fast: install ## the edit loop: skips tests marked slow
	$(PYTEST) -m "not slow"
