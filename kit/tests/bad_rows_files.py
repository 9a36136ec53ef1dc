"""Rows of the kit's bad-input table: export, code in checkpoints, where runs write, YAML."""

from __future__ import annotations

import os
import shutil

from bad_setups import (
    TENSORBOARD,
    WANDB,
    best_points_at_payload,
    bombed_run,
    classify,
    hpc_payload,
    save,
    with_net,
    with_payload,
)
from conftest import CONFIGS
from projkit.testing.bad_input import QUICK, Case, write

CASES: list[Case] = [
    # Export: the first row refuses before anything is built, the others once the model is.
    Case(
        "export",
        "no checkpoint",
        classify("export"),
        ("`export` without --ckpt_path would use untrained weights", "--ckpt_path last"),
    ),
    Case(
        "export",
        "untrained on purpose",
        classify("export", "--allow_untrained=true"),
        ("`export` needs --ckpt_path",),
        slow=True,
    ),
    Case(
        "export",
        "bare weights",
        classify("export", "--ckpt_path=weights.pt"),
        ("holds bare weights", "--ckpt_path: 'weights.pt'", "checkpoints/"),
        setup=save("weights.pt", lambda c: c["state_dict"]),
    ),
    Case(
        "export",
        "untraceable network",
        classify("export", "--model.init_args.net=probes.BranchingNet", "--ckpt_path=branching.ckpt"),
        ("torch.export cannot trace its forward", "model.init_args.net (probes.BranchingNet)", "torch.cond"),
        setup=save("branching.ckpt", with_net("probes.BranchingNet")),
        slow=True,
    ),
    Case(
        "export",
        "unknown format",
        classify("export", "--ckpt_path={ckpt}", "--formats=onnx,tflite"),
        ("is no export format", "--formats: 'tflite'", "onnx, pt2"),
        slow=True,
    ),
    Case(
        "checkpoint",
        "last of no run",
        ("test", "--config", "{classify}", "--ckpt_path=last", "--trainer.logger.init_args.name=nothing"),
        ("no readable checkpoint under", "--ckpt_path last"),
    ),
    # Code in checkpoints
    Case(
        "unsafe",
        "pickled object",
        classify("test", "--ckpt_path=crafted.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "--ckpt_path: 'crafted.ckpt'"),
        setup=save("crafted.ckpt", with_payload),
    ),
    Case(
        "unsafe",
        "hpc with weights_only=false",
        classify("fit", "--ckpt_path=hpc", "--weights_only=false"),
        ("this template loads checkpoints with weights only", "--weights_only=false"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc",
        classify("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        classify("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "a finder's own checkpoint, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        classify(
            "fit",
            "--trainer.callbacks+=faults.CodeInCheckpoints",
            "--trainer.callbacks+=projkit.callbacks.LearningRateFinder",
            "--trainer.callbacks.init_args.num_training_steps=2",
        ),
        ("holds pickled objects that `weights_only=True` refuses", ".lr_find_"),
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "best_model_path at a crafted file",
        (
            "fit",
            "--config",
            "{classify}",
            *QUICK,
            "--trainer.max_epochs=2",
            "--trainer.logger.init_args.name=crafted",
            "--ckpt_path=last",
        ),
        # The crafted file is outside the run's checkpoints/: dropped from the state, never loaded.
        ("The checkpoint's state of ModelCheckpoint", "crafted_best.ckpt'", "dropped"),
        code=0,
        setup=best_points_at_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        slow=True,
        new_run=True,
    ),
    # Where runs write: one folder under runs/, whatever the name
    Case(
        "runs",
        "name with ..",
        classify("fit", "--trainer.logger.init_args.name=../../escape"),
        ("leads out of the runs folder", "trainer.logger.init_args.name='../../escape'"),
    ),
    Case(
        "runs",
        "absolute name",
        classify("fit", "--trainer.logger.init_args.name=/tmp/tiny-escape"),
        ("an absolute path leads out of the runs folder", "name='/tmp/tiny-escape'"),
    ),
    Case(
        "runs",
        "empty name",
        classify("fit", "--trainer.logger.init_args.name="),
        ("an empty name puts the runs of every experiment in one folder", "name=''"),
    ),
    Case(
        "runs",
        "config named ...yaml",
        ("fit", "--config", "...yaml", *QUICK),
        ("'..' leads out of the runs folder", "(the file name of --config ...yaml)", "Rename the file"),
        setup=lambda workdir, ckpt: shutil.copy(CONFIGS / "classify.yaml", workdir / "...yaml"),
    ),
    Case(
        "runs",
        "version with ..",
        classify("fit", "--trainer.logger.init_args.version=../x"),
        ("leads out of the runs folder", "trainer.logger.init_args.version='../x'"),
    ),
    Case(
        "runs",
        "TensorBoard name with a separator",
        classify("fit", "--config", "tensorboard.yaml", "--trainer.logger.init_args.name=a/b"),
        ("a path separator makes it several folders", "name='a/b'"),
        setup=write("tensorboard.yaml", TENSORBOARD),
    ),
    Case(
        "runs",
        "W&B project ..",
        classify("fit", "--config", "wandb.yaml", "--trainer.logger.init_args.project=.."),
        ("leads out of the runs folder", "trainer.logger.init_args.project='..'"),
        setup=write("wandb.yaml", WANDB),
    ),
    Case(
        "runs",
        "a checkpoint file name that leads out",
        classify("fit", "--checkpoint.init_args.filename=../../x"),
        ("filename='../../x': '..' leads out of the runs folder", "The checkpoints are written in the run's"),
    ),
    Case(
        "runs",
        "a checkpoint folder outside runs/",
        classify("fit", "--last_checkpoint.init_args.dirpath={dir}/elsewhere"),
        ("where the run's checkpoints belong", "last_checkpoint.init_args.dirpath=", "outside runs/"),
    ),
    Case(
        "runs",
        "a zero-width space in the run's name",
        classify("fit", "--trainer.logger.init_args.name=digits\u200b"),
        ("holds an invisible or control character", "(U+200B ZERO WIDTH SPACE)", "init_args.name="),
    ),
    Case(
        "runs",
        "a newline in the run's version",
        classify("fit", "--trainer.logger.init_args.version=v\n1"),
        ("holds an invisible or control character", "(U+000A", "trainer.logger.init_args.version="),
    ),
    Case(
        "runs",
        "a name too long for a file name",
        classify("fit", "--trainer.logger.init_args.name=" + "n" * 300),
        ("more than a file name may be (255)", "it is 300 bytes long"),
    ),
    Case(
        "runs",
        "experiment folder a link outside",
        classify("fit", "--trainer.logger.init_args.name=elsewhere"),
        ("outside runs/ (a link?)", "runs/elsewhere"),
        setup=lambda workdir, ckpt: (
            (workdir / "outside").mkdir(),
            (workdir / "runs" / "elsewhere").symlink_to(workdir / "outside"),
        ),
    ),
    # YAML that cannot be meant, from files, flags and variables
    Case(
        "yaml",
        "duplicate key",
        classify("fit", "--config", "dup.yaml"),
        ("is given twice", "key 'max_epochs' under 'trainer'", "lines 2 and 3", "--config dup.yaml"),
        setup=write("dup.yaml", "trainer:\n  max_epochs: 3\n  max_epochs: 5\n"),
    ),
    Case(
        "yaml",
        "nested aliases",
        classify("fit", "--config", "bomb.yaml"),
        ("expand to more than 100,000 values", "--config bomb.yaml"),
        setup=write(
            "bomb.yaml",
            "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
        ),
    ),
    Case(
        "yaml",
        "duplicate key in a flag",
        classify("fit", "--trainer={{max_epochs: 1, max_epochs: 2}}"),
        ("is given twice", "trainer: cannot read"),
    ),
    Case(
        "yaml",
        "PL_FIT__TRAINER not YAML",
        classify("fit"),
        ("trainer (from PL_FIT__TRAINER): cannot read '{{{' as YAML", "while parsing a flow node"),
        env={"PL_FIT__TRAINER": "{{{"},
    ),
    Case(
        "yaml",
        "a FIFO for a class",
        classify("fit", "--trainer.strategy={dir}/fifo"),
        ("a FIFO, device or socket, not a file", "--trainer.strategy="),
        setup=lambda workdir, ckpt: os.mkfifo(workdir / "fifo"),
    ),
    Case(
        "yaml",
        "nested aliases in a resumed run's config.yaml",
        classify(
            "fit", "--trainer.max_epochs=2", "--trainer.logger.init_args.name=bombed", "--ckpt_path=last"
        ),
        ("cannot be read (UnsafeYAML)", "config.yaml cannot be read", "Resuming runs/bombed/version_0"),
        code=0,
        setup=bombed_run,
        slow=True,
        new_run=True,
    ),
]
