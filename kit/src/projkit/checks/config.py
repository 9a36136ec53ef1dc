"""Checks of the ``--config`` files and flag values, and of settings no class checks itself."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from projkit import strict_yaml
from projkit.credentials import holds_credential, masked
from projkit.rundir.naming import class_of

# seed_everything seeds numpy too, whose seeds are unsigned 32-bit integers.
MAX_SEED = 2**32 - 1
MAX_INT64 = 2**63 - 1


def check_defaults(path: Path) -> None:
    """The CLI reads the defaults from the repository's configs/ folder: say so when they are missing."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the defaults every experiment starts from are missing. The CLI reads them "
            "from the repository's configs/ folder: run it from the checkout, installed in place "
            "(`make install`), and restore configs/defaults.yaml from git if it was deleted."
        )


def check_config_files(paths: list[str], parser: LightningArgumentParser) -> None:
    """Each ``--config`` file must read as a YAML mapping of keys: name the file and what is wrong,
    where jsonargparse reports "<unicode string>" or a bare ``Unexpected config``."""
    for path in paths:
        if Path(path).is_dir():
            parser.error(f"--config {path}: is a folder, not a config file. Pass a .yaml file in it.")
        if not Path(path).is_file():
            continue  # jsonargparse names a missing file, and takes inline YAML too
        try:
            config = strict_yaml.read(path)
        except strict_yaml.YAMLFileError as error:
            parser.error(f"--config {path}: {error}.")
        except OSError as error:
            parser.error(f"--config {path}: cannot be read ({error.strerror}). Check its permissions.")
        if config is None:
            parser.error(f"--config {path}: the file is empty (or comments only). Add settings or drop it.")
        if not isinstance(config, dict):
            parser.error(
                f"--config {path}: holds a YAML {type(config).__name__}, where a config is a mapping of "
                "keys (`trainer:`, `model:`, `data:` ...). Write it as `key: value` lines."
            )


def check_special_files(args: list[str], parser: LightningArgumentParser) -> None:
    """A flag's or ``PL_*`` variable's value that names a FIFO, a device or a socket is refused: the
    parser reads a path given for a class or a mapping as a config file, and reading ``/dev/zero``
    or a FIFO without a writer never ends."""
    values = [
        (arg.split("=", 1)[0], arg.split("=", 1)[1])
        for arg in map(str, args)
        if arg.startswith("--") and "=" in arg
    ]
    values += [(name, value) for name, value in os.environ.items() if name.startswith("PL_")]
    values += [(before, arg) for before, arg in itertools.pairwise(map(str, args)) if before.startswith("--")]
    for name, value in values:
        path = Path(str(value)).expanduser()
        with contextlib.suppress(OSError, ValueError):
            if path.exists() and not (path.is_file() or path.is_dir()):
                parser.error(
                    f"{name}={value}: a FIFO, device or socket, not a file; reading it would never end "
                    "(or fail). Give a regular file or a value."
                )


def check_model_fits_data(config, parser: LightningArgumentParser) -> None:
    """The model's ``data_facts`` (what the CLI links into it) must exist on the data module: an
    image model on text data would otherwise fail deep inside its constructor."""
    model, data = class_of(config.model), class_of(config.data)
    if model is None or data is None:
        return
    missing = [fact for fact in getattr(model, "data_facts", ()) if not hasattr(data, fact)]
    if missing:
        parser.error(
            f"model {config.model.class_path} needs {', '.join(missing)} from its data module, which "
            f"{config.data.class_path} does not provide: the model and the data do not fit together "
            "(an overlay for another experiment?). Stack overlays on the experiment they were written for."
        )


def check_seed(config, parser: LightningArgumentParser) -> None:
    """numpy takes seeds in [0, 2**32 - 1] and fails deep inside ``seed_everything`` otherwise."""
    seed = config.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= MAX_SEED:
        parser.error(
            f"seed_everything={seed}: must be an integer from 0 to {MAX_SEED} (numpy's seed range), or "
            "true for a random seed. Pick another seed."
        )


def check_finite(config: Any, parser: LightningArgumentParser, key: str = "") -> None:
    """No setting takes nan or an infinity (``.nan``, ``.inf`` or ``1e400`` in YAML; a string ``nan``
    the parser refuses itself): a learning rate, a dropout or a clipping norm of nan trains on
    garbage without a word. Nor an integer beyond 64 bits, which fails deep inside torch or numpy
    once used (a batch size in a sampler). Every number of the parsed config passes here."""
    if isinstance(config, float) and not math.isfinite(config):
        parser.error(f"{key}={config}: must be a finite number. Give a finite value.")
    if isinstance(config, int) and not isinstance(config, bool) and not -MAX_INT64 - 1 <= config <= MAX_INT64:
        parser.error(
            f"{key}={config}: too large for a 64-bit integer, which torch and numpy take (at most "
            f"{MAX_INT64}). Give a smaller value."
        )
    items = (
        vars(config).items()
        if isinstance(config, Namespace)
        else config.items()
        if isinstance(config, dict)
        else ()
    )
    for name, value in items:
        check_finite(value, parser, f"{key}.{name}" if key else name)
    if isinstance(config, (list, tuple)):
        for index, value in enumerate(config):
            check_finite(value, parser, f"{key}[{index}]")


def check_weights_only(config, parser: LightningArgumentParser) -> None:
    """Checkpoints load with ``weights_only=True`` always: no switch loads the code one may carry."""
    if config.get("weights_only") is False:
        parser.error(
            "--weights_only=false: this template loads checkpoints with weights only, so that no "
            "checkpoint can run code on this machine; its own checkpoints hold plain values. Drop the "
            "flag. A foreign checkpoint you trust: load it in Python and save its state_dict."
        )


def check_credentials(config: Any, parser: LightningArgumentParser, key: str = "") -> None:
    """No setting holds a password or key (an MLflow ``tracking_uri`` of ``https://ann:pw@host``, a
    W&B ``api_key``): the run's ``config.yaml``, which must repeat the run and so cannot hold a mask,
    would keep it in clear, and W&B and MLflow keep a copy. Every text of the parsed config passes
    here; the refusal shows it masked."""
    if isinstance(config, str) and holds_credential(setting := f"{key}={config}"):
        parser.error(
            f"{masked(setting)}: holds a password or key, which the run's config.yaml (and W&B's or "
            "MLflow's copy of it) would keep in clear. Remove it and give it by the environment "
            "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, PGPASSWORD or ~/.pgpass, "
            "WANDB_API_KEY)."
        )
    items = vars(config).items() if isinstance(config, Namespace) else ()
    items = config.items() if isinstance(config, dict) else items
    for name, value in items:
        check_credentials(value, parser, f"{key}.{name}" if key else name)
    for index, value in enumerate(config if isinstance(config, (list, tuple)) else ()):
        check_credentials(value, parser, f"{key}[{index}]")
