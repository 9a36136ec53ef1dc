# `make train` and `make test` are all a new user needs: both create the environment first. This
# file holds the project's own targets; the kit's (install, test-kit, lint, cluster, rename,
# upgrade-kit, clean, ...) are in kit/kit.mk, which comes with the kit. `make help` lists both.
.DEFAULT_GOAL := help
CONFIG ?= configs/digits.yaml

# `make upgrade-kit` swaps kit/ in one step where the file system can; where it cannot, a kill
# between its two renames leaves kit/ in .kit-upgrade/aside, and this puts it back (make then goes
# on, and the next `make upgrade-kit` finishes the upgrade).
kit/kit.mk:
	@test -d .kit-upgrade/aside && test ! -e kit || \
		{ echo "error: no kit/kit.mk: git checkout -- kit restores the kit you committed" >&2; exit 2; }
	mv .kit-upgrade/aside kit
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
