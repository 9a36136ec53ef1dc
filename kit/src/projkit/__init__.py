"""projkit: the machinery of a Lightning project template, which a project configures rather than edits.

The command line (``projkit.cli``), checks and errors, run directories (``projkit.rundir``),
reliability (``projkit.reliability``), callbacks, sweeps, export and the task base
(``projkit.task.TaskModule``). A project starts it from its own package with
``projkit.project.Project``; kit/README.md lists the public API and what a project's classes provide.
Importing this package imports neither torch nor Lightning.
"""

from projkit.project import Project

__version__ = "1.1.0"

# The environment variable through which a sweep's worker (projkit.sweep) tells its trial's `fit`
# which study and trial to report to (projkit.callbacks.pruning): JSON with storage, study, trial (its
# number), metric and pruner. Here, where both read it without importing the other (Optuna; Lightning).
TRIAL_ENV = "PROJ_SWEEP_TRIAL"

__all__ = ["TRIAL_ENV", "Project", "__version__"]
