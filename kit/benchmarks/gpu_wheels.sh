#!/usr/bin/env bash
# For a GPU machine without network whose Python has torch, Lightning and the rest of what `fit`
# imports (a cluster's image, say) but not jsonargparse and the two packages its signatures extra adds
# (docstring-parser, typeshed-client): downloads those wheels here, at the versions uv.lock pins, into
# .whl/ (ignored by .gitignore), to copy over with the checkout. kit/docs/benchmarks.md says how to use them.
#   bash kit/benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."  # the checkout: its uv.lock, and .whl/ beside it
mkdir -p .whl
for name in jsonargparse docstring-parser typeshed-client; do
    version=$(awk -v name="name = \"$name\"" '$0 == name { getline; gsub(/version = |"/, ""); print; exit }' uv.lock)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$name==$version"
done
ls .whl
