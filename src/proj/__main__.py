import sys

if __name__ == "__main__":
    # `python -m proj sweep ...` runs an Optuna sweep, each of whose trials is a
    # `python -m proj fit`; the sweep itself needs neither torch nor Lightning, so it is dispatched
    # before they are imported.
    if sys.argv[1:2] == ["sweep"]:
        from proj.sweep import main as sweep

        sweep(sys.argv[2:])
    else:
        from proj.cli import main

        main()
