"""proj: a PyTorch Lightning project template (one CLI, configs that compose, two example tasks)."""

__version__ = "0.1.0"

# The environment variable through which a sweep's worker (proj.sweep) tells its trial's `fit`
# which study and trial to report to (proj.callbacks.pruning): JSON with storage, study, trial (its
# number), metric and pruner. Here, where both read it without importing the other (Optuna; Lightning).
TRIAL_ENV = "PROJ_SWEEP_TRIAL"
