"""Rows of the kit's bad-input table: config files and flags, trainer settings."""

from __future__ import annotations

from bad_setups import GPU, classify, lm
from projkit.testing.bad_input import Case, make_folder, write

CASES: list[Case] = [
    # Config files
    Case(
        "config",
        "yaml list",
        classify("fit", "--config", "list.yaml"),
        ("where a config is a mapping of keys", "list.yaml", "list"),
        setup=write("list.yaml", "- a\n- b\n"),
    ),
    Case(
        "config",
        "yaml scalar",
        classify("fit", "--config", "scalar.yaml"),
        ("where a config is a mapping of keys", "scalar.yaml", "str"),
        setup=write("scalar.yaml", "max_epochs\n"),
    ),
    Case(
        "config",
        "empty overlay",
        classify("fit", "--config", "empty.yaml"),
        ("the file is empty (or comments only)", "empty.yaml"),
        setup=write("empty.yaml", ""),
    ),
    Case(
        "config",
        "comments only",
        classify("fit", "--config", "notes.yaml"),
        ("the file is empty (or comments only)", "notes.yaml"),
        setup=write("notes.yaml", "# nothing yet\n"),
    ),
    Case(
        "config",
        "folder as config",
        classify("fit", "--config", "configs_dir"),
        ("is a folder, not a config file", "configs_dir"),
        setup=make_folder("configs_dir"),
    ),
    Case(
        "config",
        "binary config",
        classify("fit", "--config", "bin.yaml"),
        ("not UTF-8 text", "--config bin.yaml"),
        setup=write("bin.yaml", b"\xff\xfe\x00trainer"),
    ),
    Case(
        "config",
        "yaml syntax",
        classify("fit", "--config", "broken.yaml"),
        ("not valid YAML at line", "broken.yaml", "line 3", "Fix the syntax"),
        setup=write("broken.yaml", "trainer:\n  max_epochs: [3\n"),
    ),
    Case(
        "config",
        "missing file",
        ("fit", "--config", "configs/nope.yaml"),
        ("File does not exist", "nope.yaml"),
    ),
    Case(
        "config",
        "misspelt key in file",
        classify("fit", "--config", "mine.yaml"),
        ("does not accept option", "max_epocs", "Did you mean trainer.max_epochs?"),
        setup=write("mine.yaml", "trainer:\n  max_epocs: 3\n"),
    ),
    Case(
        "config",
        "misspelt key of a class in a flag",
        classify("fit", "--data.init_args.batchsize=8"),
        (
            "does not accept option",
            "data.init_args.batchsize: tinyproj.data.Blobs",
            "Did you mean data.init_args.batch_size?",
        ),
    ),
    Case(
        "config",
        "misspelt key deep in a file",
        classify("test", "--config", "deep.yaml"),
        ("does not accept option", "Did you mean model.init_args.net.init_args.hidden?"),
        setup=write("deep.yaml", "model:\n  init_args:\n    net:\n      init_args:\n        hiden: 8\n"),
    ),
    Case(
        "config",
        "misspelt key of a listed callback",
        classify("fit", "--config", "callbacks.yaml"),
        (
            "does not accept option",
            "trainer.callbacks[0].init_args.monitr: lightning.pytorch.callbacks.EarlyStopping",
            "Did you mean trainer.callbacks[0].init_args.monitor?",
        ),
        setup=write(
            "callbacks.yaml",
            "trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
            "    init_args: {monitr: val/loss}\n",
        ),
    ),
    Case(
        "config",
        "unknown top-level key",
        classify("fit", "--config", "top.yaml"),
        ("does not accept option", "colour"),
        setup=write("top.yaml", "colour: red\n"),
    ),
    Case(
        "config",
        "overlay for another experiment",
        lm("fit", "--config", "image_data.yaml"),
        (
            "from its data module, which",
            "tinyproj.models.LanguageModel needs vocab, vocab_size",
            "tinyproj.data.Blobs",
        ),
        setup=write("image_data.yaml", "data:\n  class_path: tinyproj.data.Blobs\n"),
    ),
    Case(
        "config",
        "misspelt flag",
        classify("fit", "--trainer.max_epocs=3"),
        ("unrecognized arguments", "max_epocs", "Did you mean --trainer.max_epochs?"),
    ),
    Case(
        "config",
        "wrong type",
        classify("fit", "--data.batch_size=lots"),
        ("Expected a <class 'int'>", "lots"),
    ),
    Case(
        "config",
        "unknown class path",
        classify("fit", "--model.net=tinyproj.nets.NoSuchNet"),
        ("has no attribute", "NoSuchNet"),
    ),
    # Trainer numbers
    Case(
        "trainer",
        "accumulate 0",
        classify("fit", "--trainer.accumulate_grad_batches=0"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=0"),
    ),
    Case(
        "trainer",
        "accumulate -2",
        classify("fit", "--trainer.accumulate_grad_batches=-2"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=-2"),
    ),
    Case(
        "trainer",
        "max_epochs -3",
        classify("fit", "--trainer.max_epochs=-3"),
        ("Lightning refused it", "trainer.max_epochs", "must be a non-negative integer or -1", "-3"),
    ),
    Case(
        "trainer",
        "max_steps -5",
        classify("fit", "--trainer.max_steps=-5"),
        ("Lightning refused it", "trainer.max_steps", "must be a non-negative integer or -1", "-5"),
    ),
    Case(
        "trainer",
        "min_epochs above max_epochs",
        classify("fit", "--trainer.min_epochs=5", "--trainer.max_epochs=2"),
        ("the run would stop there regardless", "trainer.min_epochs=5", "trainer.max_epochs=2"),
    ),
    Case(
        "trainer",
        "min_steps above max_steps",
        classify("fit", "--trainer.min_steps=10", "--trainer.max_steps=5"),
        ("the run would stop there regardless", "trainer.min_steps=10", "trainer.max_steps=5"),
    ),
    Case(
        "trainer",
        "devices 0",
        classify("fit", "--trainer.devices=0"),
        ("must be a positive count, -1 or auto", "trainer.devices=0"),
    ),
    Case(
        "trainer",
        "devices -3",
        classify("fit", "--trainer.devices=-3"),
        ("must be a positive count, -1 or auto", "trainer.devices=-3"),
    ),
    Case(
        "trainer",
        "max_steps 0",
        classify("fit", "--trainer.max_steps=0"),
        ("`fit` would train nothing", "trainer.max_steps=0"),
    ),
    Case(
        "trainer",
        "max_epochs 0",
        classify("fit", "--trainer.max_epochs=0"),
        ("`fit` would train nothing", "trainer.max_epochs=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0",
        classify("fit", "--trainer.limit_train_batches=0"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0.0, no test",
        classify("fit", "--trainer.limit_train_batches=0.0", "--test_after_fit=false"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0.0"),
    ),
    Case(
        "trainer",
        "limit_val_batches -1",
        classify("fit", "--trainer.limit_val_batches=-1"),
        ("Lightning refused it", "trainer.limit_val_batches", "it has to be in [0.0, 1.0] or an int", "-1"),
    ),
    Case(
        "trainer",
        "limit_test_batches 1.5",
        classify("fit", "--trainer.limit_test_batches=1.5"),
        ("Lightning refused it", "trainer.limit_test_batches", "it has to be in [0.0, 1.0] or an int", "1.5"),
    ),
    Case(
        "trainer",
        "val_check_interval 0",
        classify("fit", "--trainer.val_check_interval=0"),
        ("must be a positive count of batches or fraction", "trainer.val_check_interval=0"),
    ),
    Case(
        "trainer",
        "val_check_interval above an epoch",
        classify("fit", "--trainer.val_check_interval=10000"),
        ("Lightning refused it", "trainer.val_check_interval:", "(10000) must be less than or equal"),
    ),
    Case(
        "trainer",
        "early stopping on a misspelt metric",
        classify("fit", "--early_stopping.monitor=val/los"),
        ("logs no metric of that name", "early_stopping.init_args.monitor=val/los", "Did you mean val/loss?"),
    ),
    Case(
        "trainer",
        "checkpoint on a metric spelt the other way",
        classify("fit", "--checkpoint.monitor=val_acc"),
        ("logs no metric of that name", "checkpoint.init_args.monitor=val_acc", "Did you mean val/acc?"),
    ),
    Case(
        "trainer",
        "a plateau schedule on a metric not logged",
        lm(
            "fit",
            "--model.init_args.scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau",
            "--model.init_args.scheduler_monitor=val/perplexity",
        ),
        ("logs no metric of that name", "model.init_args.scheduler_monitor=val/perplexity", "val/loss"),
    ),
    Case(
        "trainer",
        "a listed checkpoint on a misspelt metric",
        classify("fit", "--config", "extra.yaml"),
        (
            "logs no metric of that name",
            "trainer.callbacks[0] (ModelCheckpoint).monitor=val/f",
            "val/acc_best",
        ),
        setup=write(
            "extra.yaml",
            "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
            "      init_args: {monitor: val/f, mode: max}\n",
        ),
    ),
    Case(
        "trainer",
        "check_val_every_n_epoch 0",
        classify("fit", "--trainer.check_val_every_n_epoch=0"),
        ("must be a positive integer or null", "trainer.check_val_every_n_epoch=0"),
    ),
    Case(
        "trainer",
        "log_every_n_steps -1",
        classify("fit", "--trainer.log_every_n_steps=-1"),
        ("must be 0 or more", "trainer.log_every_n_steps=-1"),
    ),
    Case(
        "trainer",
        "negative clip",
        classify("fit", "--trainer.gradient_clip_val=-1"),
        ("must be 0 or more (a negative norm", "trainer.gradient_clip_val=-1"),
    ),
    Case(
        "trainer",
        "a CSV logger flushed every 0 steps",
        classify("fit", "--trainer.logger.init_args.flush_logs_every_n_steps=0"),
        ("must be a positive number of steps", "trainer.logger.init_args.flush_logs_every_n_steps=0"),
    ),
    Case(
        "trainer",
        "gpu without one",
        classify("fit", "--config", "gpu.yaml"),
        ("but no CUDA GPU is visible", "trainer.accelerator=gpu", "cpu.yaml"),
        setup=write("gpu.yaml", GPU),
        cpu_only=True,
    ),
]
