# Sourced by the kit's launchers (find_python.sh for the job scripts, torchrun.sh) with `checkout` set
# to the project's checkout: sets PACKAGE to the package they start (`python -m $PACKAGE`), which the
# kit never names. It is the [project] name of the checkout's pyproject.toml, a "-" read as "_", as
# projkit.project.of_checkout finds it; PACKAGE given in the environment wins. A folder that holds no
# project ends the launcher in one line with the fix.
if [[ -z ${PACKAGE:-} ]]; then
  PACKAGE=$(awk '
    /^[[:space:]]*\[/ { in_project = ($0 ~ /^[[:space:]]*\[project\][[:space:]]*(#.*)?$/); next }
    in_project && /^[[:space:]]*name[[:space:]]*=/ {
      sub(/^[^=]*=[[:space:]]*["'\'']/, ""); sub(/["'\''].*$/, ""); gsub(/-/, "_"); print; exit
    }' "$checkout/pyproject.toml" 2>/dev/null || true)
  if [[ -z $PACKAGE ]]; then
    echo "error: no project in $checkout (no pyproject.toml with a [project] name): start the job" \
      "from the project's checkout, or set PACKAGE=<its package>." >&2
    exit 2
  fi
fi
