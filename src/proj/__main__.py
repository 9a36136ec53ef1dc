import os
import sys

# What a distributed launcher (torchrun, SLURM, Lightning itself) passes as whole numbers; Lightning
# reads LOCAL_RANK with int() while it is imported, so a bad value is refused before that.
INTEGER_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_PORT",
)


def check_launcher_variables() -> None:
    for name in INTEGER_VARIABLES:
        value = os.environ.get(name)
        if value is not None and not value.strip().isdigit():
            print(
                f"error: environment variable {name}={value!r}: must be a whole number >= 0, as a "
                f"launcher (torchrun, SLURM) sets it. Unset it (`unset {name}`) or set it to a number.",
                file=sys.stderr,
            )
            raise SystemExit(2)


if __name__ == "__main__":
    check_launcher_variables()
    # `python -m proj sweep ...` runs an Optuna sweep, each of whose trials is a
    # `python -m proj fit`; the sweep itself needs neither torch nor Lightning, so it is dispatched
    # before they are imported.
    if sys.argv[1:2] == ["sweep"]:
        from proj.sweep import main as sweep

        sweep(sys.argv[2:])
    else:
        from proj.cli import main

        main()
