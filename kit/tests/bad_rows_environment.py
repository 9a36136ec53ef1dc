"""Rows of the kit's bad-input table: sweep configs, numbers, the environment and the disk."""

from __future__ import annotations

from bad_setups import BOMB, PAYLOAD_TAG, classify, sweep
from projkit.testing.bad_input import Case, write

CASES: list[Case] = [
    # Sweep configs: read as strictly as configs, their storage refused in one line
    Case(
        "sweep",
        "a tab in a sweep config",
        ("sweep", "--config", "tab.yaml"),
        ("not valid YAML at line", "tab.yaml: not valid YAML at line 6", "not tabs"),
        setup=sweep("tab.yaml", lambda text: text.replace("\n  model.", "\n\tmodel.")),
    ),
    Case(
        "sweep",
        "a !!python tag in a sweep config",
        ("sweep", "--config", "tag.yaml"),
        ("asks for an object", "tag.yaml: line 7", "!!python/object/apply:os.system"),
        setup=sweep("tag.yaml", lambda text: text + PAYLOAD_TAG),
    ),
    Case(
        "sweep",
        "a Latin-1 byte in a sweep config",
        ("sweep", "--config", "latin.yaml"),
        ("not UTF-8 text", "latin.yaml", "Save it as UTF-8"),
        setup=sweep("latin.yaml", lambda text: f"# tuned by Andr\xe9\n{text}".encode("latin-1")),
    ),
    Case(
        "sweep",
        "a nan bound",
        ("sweep", "--config", "nan.yaml"),
        ("must be a finite number", "space.model.init_args.optimizer.init_args.lr: `low`", "nan"),
        setup=sweep("nan.yaml", lambda text: text.replace("low: 1.0e-4", "low: .nan")),
    ),
    Case(
        "sweep",
        "an infinite bound",
        ("sweep", "--config", "inf.yaml"),
        ("must be a finite number", "space.model.init_args.optimizer.init_args.lr: `high`", "inf"),
        setup=sweep("inf.yaml", lambda text: text.replace("high: 1.0e-2", "high: .inf")),
    ),
    Case(
        "sweep",
        "a key given twice in a sweep config",
        ("sweep", "--config", "twice.yaml"),
        ("is given twice", "twice.yaml: key 'metric'", "lines 2 and 7"),
        setup=sweep("twice.yaml", lambda text: f"{text}metric: val/acc\n"),
    ),
    Case(
        "sweep",
        "nested aliases in a sweep config",
        ("sweep", "--config", "bomb.yaml"),
        ("expand to more than 100,000 values", "bomb.yaml"),
        setup=sweep("bomb.yaml", lambda text: text + BOMB),
    ),
    Case(
        "sweep",
        "an SQLite study in memory",
        ("sweep", "--config", "mem.yaml", "--storage", "sqlite:///:memory:"),
        ("an SQLite database in memory lives in this worker alone", "--storage sqlite:///:memory:"),
        setup=sweep("mem.yaml"),
    ),
    Case(
        "sweep",
        "a database driver that is not installed",
        ("sweep", "--config", "driver.yaml", "--storage", "mysql+mysqldb://user@127.0.0.1/db"),
        ("its database driver, the Python package 'MySQLdb', is not installed", "uv add mysqlclient"),
        setup=sweep("driver.yaml"),
    ),
    # Numbers: finite, and integers that fit
    Case(
        "number",
        "lr nan",
        classify("fit", "--model.init_args.optimizer.init_args.lr=nan"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr='nan'"),
    ),
    Case(
        "number",
        "lr .nan in a config file",
        classify("fit", "--config", "lr.yaml"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr=nan"),
        setup=write("lr.yaml", "model:\n  init_args:\n    optimizer:\n      init_args:\n        lr: .nan\n"),
    ),
    Case(
        "number",
        "weight_decay inf",
        classify("fit", "--model.init_args.optimizer.init_args.weight_decay=inf"),
        ("must be a finite number", "weight_decay"),
    ),
    Case(
        "number",
        "dropout nan",
        classify("fit", "--model.init_args.net.init_args.dropout=nan"),
        ("must be a finite number", "model.init_args.net.init_args.dropout"),
    ),
    Case(
        "number",
        "gradient_clip_val 1e400",
        classify("fit", "--trainer.gradient_clip_val=1e400"),
        ("must be a finite number", "trainer.gradient_clip_val=inf"),
    ),
    Case(
        "number",
        "val_check_interval .nan",
        classify("fit", "--trainer.val_check_interval=.nan"),
        ("must be a finite number", "trainer.val_check_interval=nan"),
    ),
    Case(
        "number",
        "max_epochs 1e400",
        classify("fit", "--trainer.max_epochs=1e400"),
        ("too large for an integer", "trainer.max_epochs"),
    ),
    Case(
        "number",
        "batch_size beyond 64 bits",
        classify("fit", "--data.init_args.batch_size=99999999999999999999"),
        ("too large for a 64-bit integer", "data.init_args.batch_size=99999999999999999999"),
    ),
    Case(
        "number",
        "max_epochs nan",
        classify("fit", "--trainer.max_epochs=nan"),
        ("must be a finite number", "trainer.max_epochs"),
    ),
    # Environment and disk
    Case(
        "environment",
        "misspelt PL_FIT variable",
        classify("fit"),
        ("names no setting of", "PL_FIT__TRAINER__MAX_EPOCS", "PL_FIT__TRAINER__MAX_EPOCHS"),
        env={"PL_FIT__TRAINER__MAX_EPOCS": "3"},
    ),
    Case(
        "environment",
        "misspelt key in a PL_FIT variable's value",
        classify("fit"),
        (
            "does not accept option",
            "data.init_args.batchsize (from PL_FIT__DATA)",
            "Did you mean data.init_args.batch_size?",
        ),
        env={"PL_FIT__DATA": "{class_path: tinyproj.data.Blobs, init_args: {batchsize: 8}}"},
    ),
    Case(
        "environment",
        "PL_TEST variable for fit's key",
        classify("test", "--ckpt_path={ckpt}"),
        ("names no setting of", "PL_TEST__TRAINER__MAX_EPOCHSS"),
        env={"PL_TEST__TRAINER__MAX_EPOCHSS": "3"},
    ),
    Case(
        "environment",
        "PL_FIT variable of wrong type",
        classify("fit"),
        ("Expected a <class 'int'>", "trainer.max_epochs"),
        env={"PL_FIT__TRAINER__MAX_EPOCHS": "many"},
    ),
    Case(
        "environment",
        "a lower-case PL_FIT variable",
        classify("fit"),
        (
            "the CLI reads only upper-case names",
            "environment variable pl_fit__trainer__max_epochs",
            "PL_FIT__TRAINER__MAX_EPOCHS",
        ),
        env={"pl_fit__trainer__max_epochs": "3"},
    ),
    Case(
        "environment",
        "a config file in PL_FIT__CONFIG",
        classify("fit"),
        ("config files are given with --config", "PL_FIT__CONFIG=two.yaml", "--config two.yaml"),
        setup=write("two.yaml", "trainer:\n  max_epochs: 2\n"),
        env={"PL_FIT__CONFIG": "two.yaml"},
    ),
    Case(
        "environment",
        "save_dir under a file",
        classify("fit", "--trainer.logger.init_args.save_dir=afile/runs"),
        ("is not a folder", "save_dir: 'afile/runs'"),
        setup=write("afile", "x"),
    ),
    Case(
        "environment",
        "save_dir a file",
        classify("fit", "--trainer.logger.init_args.save_dir=afile"),
        ("is not a folder", "save_dir: 'afile'"),
        setup=write("afile", "x"),
    ),
]
