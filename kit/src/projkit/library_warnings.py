"""What the libraries under the kit print that no user can act on, silenced in this one place, which
every command installs as it starts (``projkit.project``: ``python -m <package> ...`` and
``<package>.main([...])``).

A warning a user sees is about their run: their config, their data, their machine. Where the kit
itself made a library warn, the kit's call is fixed instead (LightningCLI's ``args`` warning:
``ProjectCLI.parse_arguments``). What stays here is each library warning about its own code, or
about a choice the kit made for the user, matched narrowly: the message, the category, and the
module the warning is raised from, so that the same warning raised by another caller (the kit's own
code, the owner's) still shows. ``kit/tests/test_user_warnings.py`` runs the commands with every
warning shown (``PYTHONWARNINGS=default``) and fails on any warning that is neither silenced here nor
one its allow-list names as the user's; ``kit/docs/runs.md`` ("Warnings") lists those.

Each entry names the library version that raised it: after an upgrade that fixes one, delete it.
Nothing here imports the libraries (``serve`` and ``sweep`` start without torch and Lightning), so
categories are the standard ones the libraries' own classes derive from.
"""

from __future__ import annotations

import logging
import warnings

# The modules that raise them (regular expressions of the module's whole name).
LIGHTNING_CLI = r"lightning\.pytorch\.cli\Z"
LIGHTNING_PYTREE = r"lightning\.pytorch\.utilities\._pytree\Z"
LIGHTNING_CSV_LOGS = r"lightning\.fabric\.loggers\.csv_logs\Z"
LIGHTNING_SLURM = r"lightning\.fabric\.plugins\.environments\.slurm\Z"
LIGHTNING_DATA_CONNECTOR = r"lightning\.pytorch\.trainer\.connectors\.data_connector\Z"
LIGHTNING_DATA = r"lightning\.pytorch\.utilities\.data\Z"

# (message, category, module), as ``warnings.filterwarnings`` takes them: the message a regular
# expression matched at its start, the category with its subclasses.
SILENCED: tuple[tuple[str, type[Warning], str], ...] = (
    # jsonargparse 4.53 (since 4.49) deprecates APIs that Lightning 2.6.6's LightningCLI calls itself
    # (``_add_instantiators``, ``instantiate_classes``, ``_dump_config``), and the notice jsonargparse
    # prints before its first deprecation. JsonargparseDeprecationWarning is a DeprecationWarning.
    (r"\s*By default only one JsonargparseDeprecationWarning", DeprecationWarning, LIGHTNING_CLI),
    (r"\s*``ArgumentParser\.add_instantiator`` was deprecated", DeprecationWarning, LIGHTNING_CLI),
    (r"\s*``instantiate_classes`` was deprecated", DeprecationWarning, LIGHTNING_CLI),
    (r"\s*skip_none parameter was deprecated", DeprecationWarning, LIGHTNING_CLI),
    # torch 2.15 deprecates ``LeafSpec``, which Lightning 2.6.6's own copy of pytree flattening still
    # builds (for each CombinedLoader: every command that runs a loop).
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, LIGHTNING_PYTREE),
    # Lightning 2.6.6's CSV logger says it will overwrite metrics.csv in a run directory that has one:
    # the kit files `test`, `predict` and a resumed `fit` under the checkpoint's own run on purpose, and
    # moves metrics.csv aside and writes it back (``projkit.rundir.metrics``), so nothing is lost.
    (r"Experiment logs directory .* exists and is not empty", UserWarning, LIGHTNING_CSV_LOGS),
    # Lightning 2.6.6 warns on every Trainer, on any machine where `srun` is installed, that the command
    # was not started by `srun`, and suggests `srun python <path>/__main__.py ...`: advice for a script
    # of one's own. A command started outside a Slurm job runs on this machine, as asked (Lightning
    # starts its ranks itself); a job is `sbatch kit/scripts/slurm.sbatch ...`, which runs srun
    # (kit/docs/clusters.md). (PossibleUserWarning is a UserWarning.)
    (r"The `srun` command is available on your system but is not used", UserWarning, LIGHTNING_SLURM),
    # Lightning 2.6.6 warns of any IterableDataset with a length that loader workers may read it twice:
    # LitData's StreamingDataset (a streamed run, ``data.stream_from``) shards itself between workers
    # and processes, and its length is what each reads. (PossibleUserWarning is a UserWarning.)
    (r"Your `IterableDataset` has `__len__` defined", UserWarning, LIGHTNING_DATA),
)

# Lightning 2.6.6's adverts for its hosted services (litlogger, litmodels), logged as info lines.
ADVERT = "💡 Tip"
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERT)


_NO_ADVERTS = _NoAdverts()


def whole_tensor_loader(name: str) -> None:
    """Lightning 2.6.6 suggests loader workers for each loader with fewer than 2, on any machine of 3
    or more cores. A whole-tensor dataset (``projkit.data.loaders.batched``) is cut one batch at a time
    in the main process, measured 3-8x faster than by workers: the loader ``name``
    (``train_dataloader``, ``val_dataloader``, ...), which the kit builds on one, goes without the
    hint. A per-item dataset's loader (files decoded one by one) keeps it: raising its num_workers is
    the user's to do. (PossibleUserWarning is a UserWarning.)"""
    message = rf"The '{name}' does not have many workers"
    warnings.filterwarnings("ignore", message=message, category=UserWarning, module=LIGHTNING_DATA_CONNECTOR)


def install() -> None:
    """Silence ``SILENCED`` and the adverts in this process (again after ``warnings.catch_warnings``,
    as a test's, resets them: an entry installed twice is kept once)."""
    for message, category, module in SILENCED:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in RANK_ZERO_LOGGERS:
        logging.getLogger(name).addFilter(_NO_ADVERTS)
