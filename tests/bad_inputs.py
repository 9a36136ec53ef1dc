"""The table of bad input to this project's own modules: what a user may give its networks, data
modules and models, and what the CLI must answer.

Each row is one command line (after ``python -m proj``) with what it needs written first, the words
its message must hold (the first is the message's key, which the errors page, kit/docs/errors.md,
or the project's docs quote with its fix) and the exit code. ``test_bad_input.py`` runs every row with
the kit's runner (``projkit.testing.bad_input``); a test there checks the docs against the keys.
Arguments may hold ``{digits}``, ``{text}`` (the text experiment's config), ``{corpus}`` (the tests'
play, ``conftest.CORPUS``), all three in ``bad_setups.VALUES``, and ``{ckpt}`` (the baseline run's
last checkpoint) and ``{dir}`` (the working folder). The rows' pieces stand in ``bad_setups.py``.

What the kit refuses whatever the project (the command line, config files, trainer settings,
checkpoints, run names, ...) is the kit's own table, kit/tests/bad_inputs.py, run on its tiny project.
"""

from __future__ import annotations

import os

import torch
from projkit.testing.bad_input import QUICK, Case, Payload, make_folder, write

from bad_setups import (
    bad_image_folder,
    cut_in_its_signature,
    digits,
    image_folder,
    image_folder_fit,
    one_class_folder,
    text,
    text_checkpoint,
    val_class_train_lacks,
)
from conftest import CONFIGS

CASES: list[Case] = [
    # Networks
    Case(
        "network",
        "constructor raises (dropout)",
        digits("fit", "--model.init_args.net.init_args.dropout=1.5"),
        ("model.init_args.net (", "proj.nets.ConvNet", "dropout"),
    ),
    Case(
        "network",
        "constructor raises (channels)",
        digits("fit", "--model.init_args.net.init_args.channels=[0]"),
        ("model.init_args.net (", "proj.nets.ConvNet", "net.channels must be"),
    ),
    Case(
        "network",
        "mlp negative width",
        digits(
            "fit",
            "--model.init_args.net=proj.nets.MLP",
            "--model.init_args.net.init_args.hidden_sizes=[-4]",
        ),
        ("model.init_args.net (", "proj.nets.MLP", "net.hidden_sizes must be"),
    ),
    Case(
        "network",
        "gpt heads do not divide",
        text("fit", "--model.init_args.net.init_args.n_head=3"),
        ("model.init_args.net (", "proj.nets.GPT", "n_embd (64) must be divisible by net.n_head (3)"),
    ),
    Case(
        "network",
        "gpt block_size 0",
        text("fit", "--model.init_args.net.init_args.block_size=0"),
        ("must be a positive integer", "block_size"),
    ),
    Case(
        "network",
        "gpt n_layer 0",
        text("fit", "--model.init_args.net.init_args.n_layer=0"),
        ("model.init_args.net (", "proj.nets.GPT", "net.n_layer must be a positive integer"),
    ),
    # Text data
    Case(
        "text",
        "one distinct character",
        text("fit", "--data.init_args.path=ones.txt"),
        ("holds one distinct character", "data.path: 'ones.txt'"),
        setup=write("ones.txt", "a" * 5000),
    ),
    Case(
        "text",
        "all NUL",
        text("fit", "--data.init_args.path=nul.txt"),
        ("holds NUL bytes", "data.path: 'nul.txt'"),
        setup=write("nul.txt", b"\x00" * 5000),
    ),
    Case(
        "text",
        "binary file",
        text("fit", "--data.init_args.path=blob.bin"),
        ("is not UTF-8 text", "data.path: 'blob.bin'"),
        setup=write("blob.bin", bytes(range(256)) * 40),
    ),
    Case(
        "text",
        "folder as path",
        text("fit", "--data.init_args.path=corpus_dir"),
        ("is a folder, not a text file", "data.path: 'corpus_dir'"),
        setup=make_folder("corpus_dir"),
    ),
    Case(
        "text",
        "a device as path in a config file",
        text("fit", "--config", "device.yaml"),
        ("is not a regular file (a device, pipe or socket)", "data.path: '/dev/zero'"),
        setup=write("device.yaml", "data:\n  init_args:\n    path: /dev/zero\n"),
    ),
    Case(
        "text",
        "a FIFO as path",
        text("fit", "--data.init_args.path=pipe"),
        ("a FIFO, device or socket, not a file", "--data.init_args.path=pipe"),
        setup=lambda workdir, ckpt: os.mkfifo(workdir / "pipe"),
    ),
    Case(
        "text",
        "empty file",
        text("fit", "--data.init_args.path=empty.txt"),
        ("is empty. Point data.init_args.path", "data.path: 'empty.txt'"),
        setup=write("empty.txt", ""),
    ),
    Case(
        "text",
        "too short",
        text("fit", "--data.init_args.path=short.txt"),
        ("too few for block_size", "data.path: 'short.txt' has 40 characters", "block_size 64"),
        setup=write("short.txt", "abcdefghij" * 4),
    ),
    Case(
        "text",
        "missing, no url",
        text("fit", "--data.init_args.path=none.txt", "--data.init_args.url=null"),
        ("and data.url is null", "data.path: no text file at 'none.txt'"),
    ),
    Case(
        "text",
        "latin1",
        text("fit", "--data.init_args.path=latin1.txt"),
        ("is not UTF-8 text", "data.path: 'latin1.txt'", "iconv"),
        setup=write("latin1.txt", ("caf\xe9 " * 500).encode("latin-1")),
    ),
    Case(
        "text",
        "train_fraction 1",
        text("fit", "--data.init_args.train_fraction=1"),
        ("must be in (0, 1)", "data.train_fraction"),
    ),
    Case(
        "text",
        "val_windows 0",
        text("fit", "--data.init_args.val_windows=0"),
        ("must be a positive integer", "data.val_windows", "or null"),
    ),
    # Image data
    Case(
        "data",
        "batch_size 0",
        digits("fit", "--data.batch_size=0"),
        ("must be a positive integer", "data.batch_size"),
    ),
    Case(
        "data",
        "val_fraction 1.5",
        digits("fit", "--data.val_fraction=1.5"),
        ("must be in (0, 1)", "data.val_fraction"),
    ),
    Case(
        "data",
        "test_fraction 0",
        digits("fit", "--data.init_args.test_fraction=0"),
        ("must be in (0, 1)", "data.test_fraction"),
    ),
    Case(
        "data", "num_workers -1", digits("fit", "--data.num_workers=-1"), ("must be >= 0", "data.num_workers")
    ),
    Case(
        "data",
        "image folder missing",
        ("fit", "--config", str(CONFIGS / "image_folder.yaml"), *QUICK, "--data.init_args.root=nowhere"),
        ("data.root: no folder at", "nowhere"),
    ),
    Case(
        "data",
        "image folder channels 2",
        (
            "fit",
            "--config",
            str(CONFIGS / "image_folder.yaml"),
            *QUICK,
            "--data.init_args.root=imgs",
            "--data.init_args.channels=2",
        ),
        ("must be 1 (grey) or 3", "data.channels"),
        setup=image_folder,
    ),
    Case(
        "data",
        "image folder with unreadable files",
        image_folder_fit(),
        (
            "cannot be read as images",
            "data.root: 3 file(s) under 'imgs'",
            "'train/c0/cut.png' is truncated",
            "'train/c1/empty.png' is empty (0 bytes)",
            "'val/c1/note.png' is a text file, not an image",
            "--data.init_args.bad_files=skip",
        ),
        setup=bad_image_folder,
    ),
    Case(
        "data",
        "image folder, unreadable files skipped",
        image_folder_fit("--data.init_args.bad_files=skip", "--test_after_fit=false"),
        ("left out 3 unreadable file(s)", "data.root"),
        code=0,
        setup=bad_image_folder,
    ),
    Case(
        "data",
        "image file cut inside its signature",
        image_folder_fit(),
        ("cannot be read as images", "'train/c1/0.png' is truncated or damaged: a PNG file"),
        setup=cut_in_its_signature,
    ),
    Case(
        "data",
        "image folder of one class",
        image_folder_fit(),
        ("holds one class folder", "data.root: 'imgs/train'", "(c0)", "at least two classes"),
        setup=one_class_folder,
    ),
    Case(
        "data",
        "image folder val class train lacks",
        image_folder_fit(),
        ("has class folders that", "data.root: 'imgs/val'", "lacks: fox"),
        setup=val_class_train_lacks,
    ),
    # Generation and predict
    Case(
        "generation",
        "no prompts",
        text("predict", "--allow_untrained=true", "--data.init_args.predict_prompts=[]"),
        ("is empty or a single string", "data.predict_prompts"),
    ),
    Case(
        "generation",
        "empty prompt",
        text("predict", "--allow_untrained=true", '--data.init_args.predict_prompts=["ROMEO:", ""]'),
        ("each prompt needs at least one character", "data.predict_prompts[1] is empty"),
    ),
    Case(
        "generation",
        "prompt outside vocabulary",
        text("predict", "--allow_untrained=true", '--data.init_args.predict_prompts=["ROMEO€"]'),
        ("are not in the model's vocabulary", "data.predict_prompts[0]: characters '€'"),
    ),
    Case(
        "generation",
        "predict_tokens -1",
        text("predict", "--allow_untrained=true", "--model.init_args.predict_tokens=-1"),
        ("must be >= 0", "model.predict_tokens"),
    ),
    Case(
        "generation",
        "temperature -1",
        text("fit", "--model.init_args.temperature=-1"),
        ("must be 0 (the most likely token each time) or a number from 0.0001 to 10000", "model.temperature"),
    ),
    Case(
        "generation",
        "temperature subnormal",
        text("predict", "--allow_untrained=true", "--model.init_args.temperature=1e-320"),
        ("must be 0 (the most likely token each time) or a number from 0.0001 to 10000", "got 1e-320"),
    ),
    Case(
        "generation",
        "top_k 0",
        text("fit", "--model.init_args.top_k=0"),
        ("must be a positive integer or null (no cut)", "model.top_k"),
    ),
    Case(
        "generation",
        "sample_tokens -5",
        text("fit", "--model.init_args.sample_tokens=-5"),
        ("must be >= 0", "model.sample_tokens"),
    ),
    Case(
        "generation",
        "num_samples -1",
        text("fit", "--model.init_args.num_samples=-1"),
        ("must be >= 0", "model.num_samples"),
    ),
    Case(
        "generation",
        "empty sample prompt",
        text("fit", "--model.init_args.sample_prompt="),
        ("it needs at least one character to continue", "model.sample_prompt is empty"),
    ),
    # Fine-tuning knobs
    Case(
        "finetune",
        "freeze everything",
        text("fit", '--model.init_args.freeze=["*"]'),
        ("the patterns match every parameter", "model.freeze"),
    ),
    Case(
        "finetune",
        "freeze nothing",
        text("fit", '--model.init_args.freeze=["net.h.*"]'),
        ("matches no parameter", "model.freeze: pattern 'net.h.*'"),
    ),
    Case(
        "finetune",
        "freeze a string",
        text("fit", "--model.init_args.freeze=net.*"),
        ("Expected a <class 'collections.abc.Sequence'>", "freeze", "net.*"),
    ),
    Case(
        "finetune",
        "label_smoothing -0.1",
        digits("fit", "--model.init_args.label_smoothing=-0.1"),
        ("must be in [0, 1] (0: none)", "model.label_smoothing"),
    ),
    Case(
        "finetune",
        "label_smoothing 1.5",
        digits("fit", "--model.init_args.label_smoothing=1.5"),
        ("must be in [0, 1] (0: none)", "model.label_smoothing"),
    ),
    Case(
        "finetune",
        "init_from missing",
        text("fit", "--model.init_args.init_from=nope.ckpt"),
        ("no checkpoint file at", "model.init_from", "nope.ckpt"),
    ),
    Case(
        "finetune",
        "init_from a list",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds no state_dict", "model.init_from: 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: [1, 2]),
    ),
    Case(
        "finetune",
        "init_from non-finite",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds non-finite weights", "model.init_from: 'init.ckpt'", "net.w"),
        setup=text_checkpoint(
            lambda vocab: {
                "state_dict": {"net.w": torch.tensor([float("inf")])},
                "hyper_parameters": {"vocab": vocab},
            }
        ),
    ),
    Case(
        "finetune",
        "init_from other sizes",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("does not fit this model", "model.init_from: 'init.ckpt'", "net.lm_head.weight"),
        setup=text_checkpoint(
            lambda vocab: {
                "state_dict": {"net.lm_head.weight": torch.zeros(3, 3)},
                "hyper_parameters": {"vocab": vocab},
            }
        ),
    ),
    Case(
        "finetune",
        "init_from wrong vocabulary",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("differs from the data's", "model.init_from: the vocabulary of 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: {"state_dict": {}, "hyper_parameters": {"vocab": "ab"}}),
    ),
    # Code in checkpoints, through the language model's init_from
    Case(
        "unsafe",
        "init_from with code",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "model.init_from: 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: {"state_dict": {}, "hyper_parameters": {"vocab": Payload()}}),
    ),
]
