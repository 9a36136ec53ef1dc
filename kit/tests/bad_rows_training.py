"""Rows of the kit's bad-input table: seeds, networks, schedules and optimizers, data, checkpoints."""

from __future__ import annotations

from bad_setups import (
    bad_predict_folder,
    classify,
    lm,
    save,
    special_predict_folder,
    with_nan,
    with_wrong_shape,
)
from projkit.testing.bad_input import Case, make_folder, write

CASES: list[Case] = [
    # Seeds
    Case(
        "seed",
        "seed -1",
        classify("fit", "--seed_everything=-1"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-1"),
    ),
    Case(
        "seed",
        "seed 2**32",
        classify("fit", "--seed_everything=4294967296"),
        ("must be an integer from 0 to 4294967295", "seed_everything=4294967296"),
    ),
    Case(
        "seed",
        "seed 2**40",
        classify("fit", "--seed_everything=1099511627776"),
        ("must be an integer from 0 to 4294967295", "seed_everything=1099511627776"),
    ),
    Case(
        "seed",
        "seed from env",
        classify("fit"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-7"),
        env={"PL_FIT__SEED_EVERYTHING": "-7"},
    ),
    Case(
        "seed",
        "seed in a config file",
        classify("fit", "--config", "seed.yaml"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-2"),
        setup=write("seed.yaml", "seed_everything: -2\n"),
    ),
    # Networks: a class that refuses its arguments, or that lacks some
    Case(
        "network",
        "constructor raises (a check of its own)",
        classify("fit", "--model.init_args.net.init_args.hidden=0"),
        ("model.init_args.net (", "tinyproj.nets.MLP", "net.hidden must be a positive width"),
    ),
    Case(
        "network",
        "constructor raises (torch's dropout)",
        classify("fit", "--model.init_args.net.init_args.dropout=1.5"),
        ("model.init_args.net (", "tinyproj.nets.MLP", "dropout probability has to be between 0 and 1"),
    ),
    Case(
        "network",
        "net lacks an argument",
        classify("fit", "--model.init_args.net=torch.nn.Linear"),
        ("the following arguments are required", "torch.nn.Linear", "in_features"),
    ),
    # Schedules and optimizers
    Case(
        "schedule",
        "warmup longer than the run",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_steps=500"),
        ("is not shorter than the run's", "warmup_steps=500", "2 optimizer steps"),
        code=0,
        slow=True,
    ),
    Case(
        "schedule",
        "min_lr_ratio 1.5",
        classify("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=1.5"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "1.5"),
    ),
    Case(
        "schedule",
        "min_lr_ratio -0.1",
        classify("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=-0.1"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "-0.1"),
    ),
    Case(
        "schedule",
        "warmup -3",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_steps=-3"),
        ("warmup_steps must be >= 0", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "warmup_start 2",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_start=2"),
        ("warmup_start must be in [0, 1]", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "total_steps 0",
        classify("fit", "--model.init_args.scheduler.init_args.total_steps=0"),
        ("total_steps must be a positive integer or null", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "lr 0",
        classify("fit", "--model.init_args.optimizer.init_args.lr=0"),
        ("it must be positive", "model.init_args.optimizer: the learning rate is 0.0"),
    ),
    Case(
        "schedule",
        "lr negative",
        classify("fit", "--model.init_args.optimizer.init_args.lr=-0.001"),
        ("Invalid learning rate", "model.init_args.optimizer"),
    ),
    Case(
        "schedule",
        "betas out of range",
        classify("fit", "--model.init_args.optimizer.init_args.betas=[0.9,1.5]"),
        ("Invalid beta parameter", "model.init_args.optimizer"),
    ),
    # Data: the kit's checks of loader settings and of the image files to predict on
    Case(
        "data",
        "predict_path missing",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=nope"),
        ("data.predict_path: no folder at", "nope"),
    ),
    Case(
        "data",
        "predict_path of no files",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        ("holds no files", "data.predict_path: 'preds'", "(subfolders are not searched)"),
        setup=make_folder("preds/sub"),
    ),
    Case(
        "data",
        "predict_path with unreadable files",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        (
            "cannot be read as images",
            "data.predict_path: 3 file(s) under 'preds'",
            "'cut.png' is truncated",
            "'empty.png' is empty (0 bytes)",
            "'note.png' is a text file, not an image",
        ),
        setup=bad_predict_folder,
    ),
    Case(
        "data",
        "predict_path with a FIFO and a broken link",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        (
            "cannot be read as images",
            "data.predict_path: 2 file(s) under 'preds'",
            "'fifo' is not a regular file",
            "'gone.png' is a link to nothing",
        ),
        setup=special_predict_folder,
    ),
    Case(
        "data",
        "a network too large for any machine",
        classify("fit", "--model.init_args.net.init_args.hidden=10000000000000"),
        ("GB of memory, more than this machine can give", "model.init_args.net (tinyproj.nets.MLP): build"),
    ),
    Case(
        "data",
        "batch_size 0",
        classify("fit", "--data.init_args.batch_size=0"),
        ("must be a positive integer", "data.batch_size"),
    ),
    Case(
        "data",
        "num_workers -1",
        classify("fit", "--data.init_args.num_workers=-1"),
        ("must be >= 0", "data.num_workers"),
    ),
    Case(
        "data",
        "train_fraction 1",
        lm("fit", "--data.init_args.train_fraction=1"),
        ("must be in (0, 1)", "data.train_fraction"),
    ),
    # Checkpoints
    Case(
        "checkpoint",
        "missing",
        classify("test", "--ckpt_path=runs/none.ckpt"),
        ("no checkpoint file at", "--ckpt_path", "runs/none.ckpt", "'last'"),
    ),
    Case(
        "checkpoint",
        "truncated",
        classify("test", "--ckpt_path=broken.ckpt"),
        ("is not a readable checkpoint", "--ckpt_path: 'broken.ckpt'", "earlier checkpoint"),
        setup=write("broken.ckpt", b"PK\x03\x04 truncated"),
    ),
    Case(
        "checkpoint",
        "a folder",
        classify("test", "--ckpt_path=runs"),
        ("no checkpoint file at", "--ckpt_path", "'runs'"),
    ),
    Case(
        "checkpoint",
        "wrong shapes",
        classify("test", "--ckpt_path=shapes.ckpt"),
        ("does not fit this model", "--ckpt_path: 'shapes.ckpt'", "(3, 3) in the checkpoint", "config.yaml"),
        setup=save("shapes.ckpt", with_wrong_shape),
    ),
    Case(
        "checkpoint",
        "weights missing",
        classify("test", "--ckpt_path=few.ckpt"),
        ("does not fit this model", "--ckpt_path: 'few.ckpt'", "missing from it"),
        setup=save("few.ckpt", lambda c: {**c, "state_dict": {}}),
    ),
    Case(
        "checkpoint",
        "no state_dict",
        classify("test", "--ckpt_path=plain.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'plain.ckpt'"),
        setup=save("plain.ckpt", lambda c: {"epoch": 1}),
    ),
    Case(
        "checkpoint",
        "a list",
        classify("test", "--ckpt_path=list.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'list.ckpt'"),
        setup=save("list.ckpt", lambda c: [c]),
    ),
    Case(
        "checkpoint",
        "hyper_parameters a list",
        classify("test", "--ckpt_path=hp.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'hp.ckpt'"),
        setup=save("hp.ckpt", lambda c: {**c, "hyper_parameters": [1]}),
    ),
    Case(
        "checkpoint",
        "non-finite weights",
        classify("test", "--ckpt_path=nan.ckpt"),
        ("holds non-finite weights", "--ckpt_path: 'nan.ckpt'"),
        setup=save("nan.ckpt", with_nan),
    ),
    Case(
        "checkpoint",
        "another network",
        classify("test", "--ckpt_path={ckpt}", "--model.init_args.net=probes.BranchingNet"),
        (
            "but model.init_args.net is",
            "holds a tinyproj.nets.MLP but model.init_args.net is probes.BranchingNet",
            "config.yaml",
        ),
    ),
    Case(
        "checkpoint", "no ckpt_path", classify("test"), ("without --ckpt_path would use untrained weights",)
    ),
]
