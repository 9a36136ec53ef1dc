#!/usr/bin/env bash
# The wheels a lent GPU machine needs for `python kit/benchmarks/gpu_proof.py`, into .whl/ (ignored by
# .gitignore), at the versions uv.lock pins, for the device's `carry`. Its image (Python 3.12) holds
# torch, Lightning, torchmetrics, torchvision, scikit-learn, matplotlib, numpy, PyYAML and the rest
# of what `fit` imports, but not jsonargparse and the two packages its signatures extra adds
# (docstring-parser, typeshed-client; typeshed-client's one need, typing-extensions, is there).
# wandb, MLflow and Optuna are imported only by the logger or command that uses them.
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
