"""How much of proj a reader goes through to follow one training step, measured rather than guessed.

Runs ``fit`` on an experiment for one optimizer step, records every function of ``src/proj`` that is
called from the command's start until that step's ``optimizer.step()`` returns, and prints each file's
share: the lines of those functions, without blank lines, comments and docstrings. A function counts
whole, as a reader reads it, whichever of its branches ran.

    python scripts/reading_path.py [configs/digits.yaml]
"""

from __future__ import annotations

import ast
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import FrameType

from torch.optim.optimizer import register_optimizer_step_post_hook

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "proj"
# Modules that run beside the step without changing what it computes: a reader may skip them. The
# checks of what the user gave (checks, data/checks) and how a refusal is reported (errors); the
# run directory (rundir); safety against kills and divergence (reliability); callbacks.
BESIDE_THE_STEP = ("callbacks/", "checks/", "data/checks.py", "errors.py", "reliability/", "rundir/")


def called_functions(config: str) -> set[tuple[str, int, str]]:
    from proj.cli import main

    called: set[tuple[str, int, str]] = set()

    def record(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(str(PACKAGE)):
            called.add((code.co_filename, code.co_firstlineno, code.co_name))

    register_optimizer_step_post_hook(lambda *args: sys.setprofile(None))
    with tempfile.TemporaryDirectory() as runs:
        sys.setprofile(record)
        try:
            main(["fit", "--config", config, "--trainer.max_steps=1", "--trainer.num_sanity_val_steps=0",
                  "--test_after_fit=false", "--trainer.enable_progress_bar=false",
                  f"--trainer.logger.init_args.save_dir={runs}"])  # fmt: skip
        finally:
            sys.setprofile(None)
    return called


def code_lines(source: str, node: ast.AST) -> int:
    lines = source.splitlines()
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number in range(node.lineno, node.end_lineno + 1)
        if (text := lines[number - 1].strip()) and not text.startswith("#") and number not in docstrings
    )


def main(config: str) -> None:
    per_file: dict[str, int] = defaultdict(int)
    for filename, first_line, name in called_functions(config):
        source = Path(filename).read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if start <= first_line <= node.end_lineno:
                    per_file[str(Path(filename).relative_to(PACKAGE))] += code_lines(source, node)
                    break
    step = {f: n for f, n in per_file.items() if not f.startswith(BESIDE_THE_STEP)}
    beside = {f: n for f, n in per_file.items() if f not in step}
    for title, files in (("the step", step), ("beside the step", beside)):
        print(f"{title}:")
        for file, lines in sorted(files.items()):
            print(f"  {lines:5d}  src/proj/{file}")
        print(f"  {sum(files.values()):5d}  in {len(files)} files")
    print(f"{sum(per_file.values())} lines in {len(per_file)} files from `fit` to the first optimizer.step()")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "configs/digits.yaml")
