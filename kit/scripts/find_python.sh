# Sourced by the kit's job scripts (kit/scripts/slurm.sbatch, kit/scripts/sweep.sbatch): sets PYTHON to
# the project's own interpreter, however the project was installed, and PACKAGE to the package the job
# runs (`python -m $PACKAGE`), or ends the job in one line with the fix. A job starts in a shell of its
# own, where `uv` (installed by `make` into .tools/bin) and an activated environment of the submitting
# shell may be missing; Slurm runs a copy of the job script from a spool folder, so the checkout is the
# folder the job was submitted from. PYTHON, in order:
#   $PYTHON as given (a command, e.g. "uv run --frozen --no-sync python"),
#   the checkout's .venv/bin/python (`make install` makes it),
#   the environment active where the job was submitted ($VIRTUAL_ENV, which sbatch passes on),
#   uv on PATH, or where `make` put it (.tools/bin/uv), running the locked environment.
# PACKAGE: as given, else kit/scripts/package.sh reads it from the checkout's pyproject.toml.
checkout=${SLURM_SUBMIT_DIR:-$PWD}
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x $checkout/.venv/bin/python ]]; then
    PYTHON=$checkout/.venv/bin/python
  elif [[ -n ${VIRTUAL_ENV:-} && -x $VIRTUAL_ENV/bin/python ]]; then
    PYTHON=$VIRTUAL_ENV/bin/python
  elif command -v uv >/dev/null; then
    PYTHON="uv run --frozen --no-sync python"
  elif [[ -x $checkout/.tools/bin/uv ]]; then
    PYTHON="$checkout/.tools/bin/uv run --frozen --no-sync python"
  else
    echo "error: no Python environment for this job in $checkout (no .venv/bin/python, no active" \
      "environment, no uv): run \`make install\` in the checkout and submit from there, or set" \
      "PYTHON=/path/to/python when submitting." >&2
    exit 2
  fi
fi
# shellcheck source=kit/scripts/package.sh
source "$checkout/kit/scripts/package.sh"
