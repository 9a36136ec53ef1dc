"""A checkpoint names files of its own run only: the callback state it carries is checked before
Lightning acts on it, so a crafted checkpoint cannot make a command delete or write elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn

from projkit.checks.checkpoint import count
from projkit.errors import ConfigError

# The files a ModelCheckpoint's state names, and the scores that go with them.
PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")
SCORES = ("best_model_score", "kth_value")
# Longer than any path the file system takes: refused without asking it.
LONGEST_PATH = 4096


class ContainedState(Callback):
    """Checks the callback state of a checkpoint that ``fit`` resumes (or a finder restores) before
    Lightning hands it to the callbacks: every callback's ``on_load_checkpoint`` runs before the
    first ``load_state_dict``.

    Each file a ``ModelCheckpoint``'s state names (its best, k-th best and last checkpoint, each of
    its ``best_k_models``) must be a ``.ckpt`` inside that callback's own folder once ``..`` and
    links are resolved, or it is dropped with a warning: Lightning deletes the k-th best file when a
    better one comes, recursively, after a parent check that does not resolve ``..``, so a checkpoint
    of plain strings could make a resume delete any folder. Any other callback's state must have the
    types of that callback's own, or is dropped whole (the callback starts afresh). The state of the
    command's loop, which it cannot do without, must be counters where the loop keeps counters, or
    the checkpoint is refused. The CLI adds this callback to every command; it has no setting.
    """

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        check_loop_state(checkpoint, trainer)
        states = checkpoint.get("callbacks")
        if not isinstance(states, dict):
            return
        for callback in trainer.callbacks:
            key = callback.state_key
            if key not in states:
                continue
            state, said = contained(states[key], callback)
            if state is None:
                del states[key]
            else:
                states[key] = state
            for line in said:
                rank_zero_warn(f"The checkpoint's state of {type(callback).__name__}: {line}")


def check_loop_state(checkpoint: dict, trainer: Trainer) -> None:
    """The saved state of the loop this command runs, refused unless it has the loop's own shape:
    Lightning does arithmetic on each counter, and the step names a file of the run."""
    loops = checkpoint.get("loops")
    if loops is None or trainer.state.fn is None:
        return
    name = f"{trainer.state.fn.value}_loop"
    saved = loops.get(name) if isinstance(loops, dict) else None
    odd = odd_state(saved, getattr(trainer, name).state_dict(), f"loops.{name}", top=True)
    if odd:
        raise ConfigError(
            f"--ckpt_path: '{trainer.ckpt_path}' is no checkpoint as Lightning writes it (its {odd} is not "
            "what the loop keeps there): it was edited or made elsewhere. Use another checkpoint of the "
            "run (runs/<experiment>/<version>/checkpoints/)."
        )


def odd_state(saved: Any, own: Any, key: str, top: bool = False) -> str | None:
    """The key of the first value of ``saved`` that is not of the kind ``own`` has there (a counter,
    a flag, a mapping with the same keys); None when there is none. At the ``top`` of a loop's state
    a key may be missing: Lightning reads older checkpoints without it."""
    if isinstance(own, dict):
        if not isinstance(saved, dict):
            return key
        for name, value in own.items():
            if name not in saved:
                if top:
                    continue
                return f"{key}.{name}"
            if odd := odd_state(saved[name], value, f"{key}.{name}"):
                return odd
        return None
    if isinstance(own, bool):
        return None if isinstance(saved, bool) else key
    if isinstance(own, int):
        return None if count(saved) else key
    return None


def contained(state: Any, callback: Callback) -> tuple[dict | None, list[str]]:
    """``state`` as ``callback`` may load it, None to load none, and what was dropped."""
    if not isinstance(state, dict):
        return None, [f"a {type(state).__name__}, not a mapping: dropped, the callback starts afresh"]
    if isinstance(callback, ModelCheckpoint):
        return contained_checkpoints(state, callback)
    wrong = wrong_types(state, callback.state_dict())
    if wrong:
        return None, [f"{', '.join(wrong)} of another type than the callback's: dropped, it starts afresh"]
    return state, []


def wrong_types(state: dict, own: dict) -> list[str]:
    """The keys of ``state`` whose value is of another kind than the callback's own value there."""
    return [
        str(key)
        for key, value in state.items()
        if key in own and own[key] is not None and kind(value) != kind(own[key])
    ]


def kind(value: Any) -> str:
    """What a state value is, as far as using it goes: a flag, a whole number (an enum's too), a
    scalar tensor (compared with the metric), another tensor, text..."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, torch.Tensor):
        return "scalar" if value.ndim == 0 and not value.is_complex() else "tensor"
    return type(value).__name__


def contained_checkpoints(state: dict, callback: ModelCheckpoint) -> tuple[dict | None, list[str]]:
    """A ``ModelCheckpoint``'s state with every file it names inside the callback's own folder."""
    best_k = state.get("best_k_models", {})
    # Lightning reads these two whatever else the state holds.
    scores_ok = "best_model_path" in state and "best_model_score" in state and isinstance(best_k, dict)
    scores_ok = scores_ok and all(score(state.get(name)) for name in SCORES)
    if not scores_ok or not all(score(value, required=True) for value in best_k.values()):
        return None, ["no scores, or scores that are no scalar tensors: dropped, the callback starts afresh"]
    folder = own_folder(callback)

    def mine(path: Any) -> bool:
        return inside(nothing_as_empty(path), folder, callback)

    outside = sorted({str(p)[:200] for p in [*best_k, *(state.get(name) for name in PATHS)] if not mine(p)})
    kept = {path: value for path, value in best_k.items() if path and mine(path)}
    fixed = {**state, "best_k_models": kept}
    worst, best = (max, min) if callback.mode == "min" else (min, max)
    kth = state.get("kth_best_model_path")
    # Lightning deletes the k-th best file from among the best ones: it must be one of them.
    if (not isinstance(kth, str) or kth not in kept) if kept else not mine(kth):
        fixed["kth_best_model_path"], fixed["kth_value"] = pick(worst, kept, callback.kth_value)
    if not mine(state.get("best_model_path")):
        fixed["best_model_path"], fixed["best_model_score"] = pick(best, kept, None)
    if not mine(state.get("last_model_path")):
        fixed["last_model_path"] = ""
    if outside:
        return fixed, [
            f"{', '.join(map(repr, outside))} outside {callback.dirpath}: dropped, as a checkpoint names "
            "only checkpoint files of its own run"
        ]
    if fixed["kth_best_model_path"] != kth:
        return fixed, [f"its k-th best file {str(kth)[:200]!r} is none of its best: the worst of them taken"]
    return state, []


def pick(choose: Any, best_k: dict, empty: Any) -> tuple[str, Any]:
    """The file ``choose`` (``min`` or ``max``) takes by score from ``best_k``, and its score;
    nothing and ``empty`` when there is none."""
    if not best_k:
        return "", empty
    chosen = choose(best_k, key=lambda path: float(best_k[path]))
    return chosen, best_k[chosen]


def nothing_as_empty(path: Any) -> Any:
    """A path field as ``inside`` takes it: None (nothing named) as the empty path."""
    return "" if path is None else path


def own_folder(callback: ModelCheckpoint) -> Path | None:
    try:
        return Path(callback.dirpath).resolve() if callback.dirpath else None
    except (OSError, RuntimeError, ValueError):
        return None


def inside(path: Any, folder: Path | None, callback: ModelCheckpoint) -> bool:
    """Whether ``path`` names a checkpoint file inside ``folder``, ``..`` and links resolved (the
    empty path names nothing, which is allowed)."""
    if path == "":
        return True
    if folder is None or not isinstance(path, str) or len(path) > LONGEST_PATH or "\0" in path:
        return False
    if not path.endswith(callback.FILE_EXTENSION):
        return False
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return folder in resolved.parents


def score(value: Any, required: bool = False) -> bool:
    """Whether ``value`` is a score as a ``ModelCheckpoint`` keeps it: a scalar tensor."""
    if value is None:
        return not required
    return kind(value) == "scalar"
