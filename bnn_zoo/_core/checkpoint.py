"""The checkpoint file of a fit: its format, its writing, and resuming a run from it.

A checkpoint is a dict of tensors and plain data (``format`` `CHECKPOINT_FORMAT`,
the run's description [`run_description`][bnn_zoo._core.step.SVIStep.run_description], the step's
`state_dict` and the loss history), written atomically
and read with ``torch.load(weights_only=True)``, so loading it runs no pickled code. A run
resumes from a checkpoint only if the checkpoint describes the same run: the same model
and guide tensors and shapes, data size, minibatching, ELBO and KL weighting. A different
learning rate is applied to the resumed optimiser with a `CheckpointWarning`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from bnn_zoo._core.files import load_plain, save_atomic
from bnn_zoo._core.lr_schedule import set_lr
from bnn_zoo._core.step import SVIStep

__all__ = ["CHECKPOINT_FORMAT", "CheckpointWarning", "checkpoint_path", "resume",
           "save_checkpoint"]

#: The ``format`` field of a checkpoint of [`bnn_zoo._core.training.fit`][].
CHECKPOINT_FORMAT = "bnn_zoo.checkpoint/1"


class CheckpointWarning(UserWarning):
    """A checkpoint was resumed with a setting that differs from the one it was saved
    with and that the resumed run applies (the learning rate)."""


def checkpoint_path(checkpoint: object) -> Path | None:
    """``checkpoint`` as a path whose folder exists, checked before any training."""
    if checkpoint is None:
        return None
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"Expected checkpoint to be a file path, but got {checkpoint!r}.")
    path = Path(checkpoint)
    if path.is_dir():
        raise ValueError(f"Expected checkpoint to be a file, but {str(path)!r} is a folder.")
    if not path.parent.is_dir():
        raise ValueError(f"Expected checkpoint in an existing folder, but {str(path.parent)!r} "
                         "does not exist.")
    return path


_CHECKPOINT_KEYS = {"run", "modules", "optimizer", "step", "position", "perm", "order", "rng",
                    "losses"}


def resume(step: SVIStep, path: Path, steps: int) -> list[float]:
    """Load the checkpoint ``path`` into ``step`` after checking that it belongs to this
    run (a ``ValueError`` naming the file and what differs otherwise, or when it has done
    more than ``steps`` steps); return its loss history."""
    state = load_plain(path, what="the checkpoint", map_location=step.x.device)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a checkpoint of bnn_zoo.fit (expected format "
                         f"{CHECKPOINT_FORMAT!r}); delete it or pass another checkpoint.")
    missing = sorted(_CHECKPOINT_KEYS - state.keys())
    if missing or not isinstance(state["run"], dict):
        raise ValueError(f"The checkpoint {str(path)!r} is incomplete (missing "
                         f"{', '.join(missing) or 'run'}); delete it to start afresh.")
    saved, here = state["run"], step.run_description()
    lr = here.pop("lr")
    saved_lr = saved.pop("lr")
    differences = [f"{key} is {saved.get(key)!r} in the file but {value!r} in this run"
                   for key, value in here.items() if key != "tensors" and saved.get(key) != value]
    names = saved.get("tensors", {})
    if names.keys() != here["tensors"].keys():
        missing = sorted(here["tensors"].keys() - names.keys())
        extra = sorted(names.keys() - here["tensors"].keys())
        differences.append(f"the model and guide tensors differ (missing from the file: "
                           f"{missing[:5]}, not in this run: {extra[:5]})")
    else:
        differences += [f"tensor {name!r} has shape {names[name]} in the file but {shape} in "
                        "this run" for name, shape in here["tensors"].items()
                        if names[name] != shape]
    if differences:
        raise ValueError(f"The checkpoint {str(path)!r} belongs to another run: "
                         + "; ".join(differences) + ".")
    if state["step"] > steps:
        raise ValueError(f"Expected steps >= the {state['step']} steps already done in the "
                         f"checkpoint {str(path)!r}, but got steps={steps}.")
    step.load_state_dict(state)
    if saved_lr != lr:
        warnings.warn(f"The checkpoint {str(path)!r} was trained with lr={saved_lr!r}; the "
                      f"resumed run goes on with lr={lr!r}.", CheckpointWarning, stacklevel=3)
        set_lr(step.optimizer, lr)
    return [float(value) for value in state["losses"]]


def save_checkpoint(step: SVIStep, losses: list, path: Path) -> None:
    """Write the checkpoint of ``step`` and its loss history ``losses`` to ``path``
    atomically (a temporary file in the same folder, renamed over it)."""
    save_atomic({"format": CHECKPOINT_FORMAT, "run": step.run_description(),
                 **step.state_dict(), "losses": losses}, path)
