"""Where NCF writes its checkpoints, what they hold, and how they are read back (:class:`Checkpoints`).

``--checkpoint_dir DIR`` holds two files, NVIDIA's name for the best epoch and ours for resuming::

    DIR/model.pth    the state after the best epoch so far (by validation HR@K, or test HR@K with
                     ``--select_on test``); ``--mode test`` evaluates it
    DIR/last.pth     the state after the latest finished epoch; ``--resume`` continues from it exactly

Each is one ``torch.save`` of a dict of tensors and numbers (:func:`training_state`): ``format``
(``ncf-checkpoint-v1``), the model configuration (``model``, users, items, ``factors``, ``layers``, ``dropout``:
a resume with another one is refused), the model and optimizer (and AMP scaler) state, the epoch, the seed, the best
epoch's HR/NDCG, the training time so far and the time to target. Written under a temporary name and renamed
(``recsys_common.io.atomic_path``): a crash (SIGKILL) leaves the previous file whole. Read with
``torch.load(weights_only=True)``: a checkpoint from elsewhere cannot run code. A bare ``state_dict`` (NVIDIA's
``model.pth``, with its NeuMF names) loads as weights only.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from recsys_common import checkpoints as catalogue
from recsys_common.io import atomic_path

from .model import from_nvidia_state_dict, is_nvidia_state_dict, strip_ddp_prefix

CHECKPOINT_FORMAT = "ncf-checkpoint-v1"
BEST_CHECKPOINT = "model.pth"     # NVIDIA's name: the weights of the best epoch so far
RESUME_CHECKPOINT = "last.pth"    # the state after the latest finished epoch, for --resume


class CheckpointError(catalogue.CheckpointError):
    """A checkpoint that cannot be used with this configuration; the message names the file and shapes."""


def model_config(model: str, num_users: int, num_items: int, factors: int, layers: List[int],
                 dropout: float) -> Dict[str, Any]:
    """The configuration a checkpoint must match to be resumed (``--model``, ``--factors``, ``--layers``,
    ``--dropout`` and the dataset's users and items)."""
    return {"model": model, "num_users": num_users, "num_items": num_items, "factors": factors,
            "layers": list(layers), "dropout": dropout}


def read_checkpoint(path: str) -> Dict[str, Any]:
    """Checkpoint ``path`` as a dict (ours; or ``{"model": state_dict}`` for a bare state_dict, as NVIDIA's)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable checkpoint: {err}") from err
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        return obj
    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {"model": obj}  # a bare state_dict, as NVIDIA's recipe saves
    raise CheckpointError(f"{path}: neither an NCF checkpoint nor a model state_dict")


def load_model_weights(model: nn.Module, state: Dict[str, torch.Tensor], path: str) -> None:
    """Copy ``state`` into ``model`` after checking every name and shape; the error lists the mismatches.

    ``state`` may be ours, saved from DDP (``module.`` prefixes), or NVIDIA's NeuMF naming (a bare ``model.pth`` of
    NVIDIA's recipe: ``mf_user_embed``, ``mlp.N``, ``final``; mapped by :func:`neumf.model.from_nvidia_state_dict`).
    """
    expected = model.state_dict()
    state = strip_ddp_prefix(state)
    if is_nvidia_state_dict(state):
        try:
            state = from_nvidia_state_dict(state, model)
        except ValueError as err:
            raise CheckpointError(f"{path}: {err}") from err
    problems = []
    for name in sorted(set(expected) | set(state)):
        if name not in state:
            problems.append(f"{name}: missing from the checkpoint (expected shape {list(expected[name].shape)})")
        elif name not in expected:
            problems.append(f"{name}: in the checkpoint (shape {list(state[name].shape)}) but not in this model")
        elif state[name].shape != expected[name].shape:
            problems.append(f"{name}: shape {list(state[name].shape)} in the checkpoint, "
                            f"{list(expected[name].shape)} for this configuration")
    if problems:
        raise CheckpointError(f"{path}: checkpoint does not match this configuration (--model, --factors, --layers "
                              f"or the dataset's users/items differ):\n  " + "\n  ".join(problems))
    model.load_state_dict(state)


def read_resume_state(checkpoint_dir: str, config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``checkpoint_dir/last.pth``, checked to hold a training state (and, given ``config``, that configuration:
    every differing field is named)."""
    path = os.path.join(checkpoint_dir, RESUME_CHECKPOINT)
    state = read_checkpoint(path)
    if "epoch" not in state:
        raise CheckpointError(f"{path}: has no training state to resume from")
    if config is not None:
        check_config(state, config, path)
    return state


def check_config(state: Dict[str, Any], config: Dict[str, Any], path: str) -> None:
    """Refuse to resume ``state`` under another model configuration, naming every differing field."""
    try:
        catalogue.check_config(state.get("config") or {}, config, path,
                               {"num_users": "the dataset's users", "num_items": "the dataset's items"})
    except catalogue.CheckpointError as err:
        raise CheckpointError(str(err)) from None
    missing = sorted(set(config) - set(state.get("config") or {}))
    if missing:
        raise CheckpointError(f"{path}: saved for configuration {state.get('config')}, this run is {config}")


def written_by_ncf(path: str) -> bool:
    """Whether ``path`` is a checkpoint this recipe wrote (an ``ncf-checkpoint-v1`` dict), read without pickle."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        try:  # mmap needs the zipfile format; any older file still loads the plain way
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            return False
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT


def check_checkpoint_dir(checkpoint_dir: str, rank: int, device: torch.device) -> None:
    """Refuse, before training, a --checkpoint_dir whose model.pth / last.pth this recipe did not write.

    A user's own file there (NVIDIA's bare ``model.pth``, another tool's output) would otherwise be replaced by the
    first improved epoch. Checkpoints of an earlier ncf.py run are ours and are replaced as the new run improves
    (NVIDIA's behaviour; ``--resume`` continues that run instead). Rank 0 decides; every rank raises together.
    """
    if not checkpoint_dir:
        return
    foreign = []
    if rank == 0:
        for name in (BEST_CHECKPOINT, RESUME_CHECKPOINT):
            path = os.path.join(checkpoint_dir, name)
            if os.path.lexists(path) and not (os.path.isfile(path) and written_by_ncf(path)):
                foreign.append(path)
    count = torch.tensor([float(len(foreign))], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
    if float(count.item()) > 0:
        where = ", ".join(foreign) if foreign else f"{checkpoint_dir} (checked on rank 0)"
        raise CheckpointError(f"{where}: exists and was not written by ncf.py (not an {CHECKPOINT_FORMAT} "
                              f"checkpoint); refusing to overwrite it: move it away or choose another "
                              f"--checkpoint_dir (to start from its weights, pass it as --load_checkpoint_path)")


def training_state(config: Dict[str, Any], model: nn.Module, optimizer, scaler, epoch: int, seed: int,
                   best: Dict[str, Any], elapsed: float, time_to_target: Optional[float]) -> Dict[str, Any]:
    """What a checkpoint holds after ``epoch`` (see the module docstring); ``best``: ``hr``, ``ndcg``, ``epoch`` (and
    ``valid_hr``, the chosen epoch's validation HR, when choosing on validation)."""
    return {"format": CHECKPOINT_FORMAT, "config": config, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict() if scaler else None,
            "epoch": epoch, "seed": seed, "best_hr": best["hr"], "best_ndcg": best["ndcg"],
            "best_epoch": best["epoch"], "best_valid_hr": best.get("valid_hr", -1.0), "elapsed": elapsed,
            "time_to_target": time_to_target}


def save_checkpoint(path: str, payload: Dict) -> None:
    """torch.save under a temporary name, then rename: a crash never leaves a half-written checkpoint."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def save_epoch(checkpoint_dir: str, state: Dict[str, Any], improved: bool) -> None:
    """Rank 0, after each epoch: ``last.pth``, and ``model.pth`` too when the epoch improved HR."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    if improved:
        save_checkpoint(os.path.join(checkpoint_dir, BEST_CHECKPOINT), state)
    save_checkpoint(os.path.join(checkpoint_dir, RESUME_CHECKPOINT), state)


def kept_checkpoints(checkpoint_dir: str, best: Dict, epoch: int) -> str:
    """What a diverged run leaves behind, for its error message."""
    if not checkpoint_dir:
        return "Nothing was saved (no --checkpoint_dir)."
    if epoch == 0 or best["epoch"] < 0:
        return f"No checkpoint of this run was written to {checkpoint_dir}."
    return (f"The last good checkpoints are kept: {os.path.join(checkpoint_dir, RESUME_CHECKPOINT)} (after epoch "
            f"{epoch - 1}) and {os.path.join(checkpoint_dir, BEST_CHECKPOINT)} (best, epoch {best['epoch']}, "
            f"HR {best['hr']:.5f}).")


class Checkpoints:
    """One run's ``--checkpoint_dir``: where its two files are, what they hold, and the checks around them.

    Constructed once per run. ``for_training``: refuse, before anything is trained, a directory holding a
    ``model.pth`` / ``last.pth`` this recipe did not write (:func:`check_checkpoint_dir`; every rank takes part).
    An empty ``directory`` means no checkpoints: :meth:`save` does nothing and :attr:`best_path` is None.
    """

    def __init__(self, directory: str, *, for_training: bool, rank: int = 0,
                 device: torch.device = torch.device("cpu")):
        self.directory = directory or ""
        self.rank = rank
        if for_training:
            check_checkpoint_dir(self.directory, rank, device)

    @property
    def best_path(self) -> Optional[str]:
        """``DIR/model.pth`` (NVIDIA's name: the best epoch so far), None without a directory."""
        return os.path.join(self.directory, BEST_CHECKPOINT) if self.directory else None

    @property
    def resume_path(self) -> Optional[str]:
        """``DIR/last.pth`` (the latest finished epoch), None without a directory."""
        return os.path.join(self.directory, RESUME_CHECKPOINT) if self.directory else None

    def resume_state(self, seed: Optional[int]) -> Dict[str, Any]:
        """``last.pth``'s training state, refused when ``seed`` (``--seed``; None: take the saved one) differs from
        the seed it was saved with (an exact resume needs the same seed)."""
        state = read_resume_state(self.directory)
        if seed is not None and seed != int(state["seed"]):
            raise CheckpointError(f"{self.resume_path}: saved by a run with --seed {state['seed']}, this run has "
                                  f"--seed {seed}: an exact resume needs the same seed")
        return state

    def save(self, state: Dict[str, Any], improved: bool) -> None:
        """After an epoch, on rank 0: ``last.pth``, and ``model.pth`` when the epoch improved HR (atomic writes)."""
        if self.directory and self.rank == 0:
            save_epoch(self.directory, state, improved)

    def describe(self, best: Dict, epoch: int) -> str:
        """What a run that stopped in ``epoch`` leaves behind (for its error message)."""
        return kept_checkpoints(self.directory, best, epoch)
