"""The checkpoint catalogue every recipe shares: naming, finding, checking, pruning and when to save. No framework.

A recipe's checkpoint root holds one directory per saved training step, each complete or absent::

    ROOT/step_000000040/      complete: holds the recipe's manifest file (its "marker", written last)
    ROOT/step_000000080/      ...the newest --keep_checkpoints are kept
    ROOT/.step_000000120.tmp-*   a save a crash interrupted (never read; removed by the next save)

What is inside a checkpoint (weights, optimizer state, RNG) is the recipe's business (``checkpointing.py`` of each
recipe, in its framework); this module only knows the directory names and the marker, a JSON object with a
``format_version``. The marker's name is the recipe's (``meta.json`` in PyTorch DLRM, ``state.json`` in TF2 DLRM),
so checkpoints written before this module existed resume unchanged.

    >>> import json, os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for step in (40, 80):
    ...     os.makedirs(os.path.join(root, checkpoint_name(step)))
    ...     with open(os.path.join(root, checkpoint_name(step), "meta.json"), "w") as f:
    ...         json.dump({"format_version": 2, "config": {"dim": 8}}, f)
    >>> os.path.basename(resolve_checkpoint(root, "meta.json"))
    'step_000000080'
    >>> [s for s, _ in prune_checkpoints(root, 1, "meta.json")] == [40] and len(list_checkpoints(root, "meta.json"))
    1
    >>> check_config({"dim": 8, "mlp": [4]}, {"dim": 16, "mlp": [8]}, "ck/meta.json", {"dim": "--embedding_dim"})
    Traceback (most recent call last):
    ...
    recsys_common.checkpoints.CheckpointError: ck/meta.json: the checkpoint's model differs from the one the flags \
describe; a checkpoint loads only into the same model. Differing: dim: checkpoint 8, flags 16 (set by \
--embedding_dim); mlp: checkpoint [4], flags [8] (set by --mlp)
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from recsys_common.cli import InputError

CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)$")
# Staging directories of recsys_common.io.atomic_directory for a step_<N> (".old": the one it replaces).
STALE_PATTERN = re.compile(r"^\.step_\d+(\.old)?\.tmp-")


class CheckpointError(InputError):
    """A checkpoint that is missing, incomplete, or does not match the model; the message names the file or flag."""


def checkpoint_name(global_step: int) -> str:
    """``step_<global_step>``, zero-padded to 9 digits so that names sort by step."""
    return f"step_{int(global_step):09d}"


# ------------------------------------------------------------------------------------------------ finding checkpoints
def list_checkpoints(root: Optional[str], marker: str) -> List[Tuple[int, str]]:
    """Complete checkpoints (``step_<N>`` holding ``marker``) directly under ``root``, as ``(step, path)``, oldest
    first; [] when ``root`` is not a directory."""
    if not root or not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = CHECKPOINT_PATTERN.match(name)
        path = os.path.join(root, name)
        if match and os.path.isfile(os.path.join(path, marker)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def resolve_checkpoint(path: str, marker: str, flag: str = "") -> str:
    """``path`` itself when it is one checkpoint, else the newest complete checkpoint directly under it.

    ``flag``: the flag that gave ``path``, named in the error (``--load_checkpoint_path``)."""
    if os.path.isfile(os.path.join(path, marker)):
        return path
    newest = list_checkpoints(path, marker)
    if newest:
        return newest[-1][1]
    given = f" ({flag})" if flag else ""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: checkpoint not found{given}")
    raise CheckpointError(f"{path}: no complete checkpoint in it (neither {marker} nor step_<N>/{marker}; a "
                          f"checkpoint interrupted while being written is ignored){given}")


def read_marker(path: str, marker: str, format_version: int, required: Sequence[str] = (),
                version_hints: Optional[Mapping[Any, str]] = None,
                unversioned: Optional[int] = None) -> Dict[str, Any]:
    """The marker of checkpoint directory ``path``, checked: a JSON object of ``format_version`` with the
    ``required`` keys. ``version_hints``: for a known older version, what to tell the user (appended in brackets).
    ``unversioned``: the version of a marker without ``format_version`` (written before the field existed)."""
    marker_path = os.path.join(path, marker)
    if not os.path.isfile(marker_path):
        raise CheckpointError(f"{path}: not a complete checkpoint ({marker_path} is missing)")
    try:
        with open(marker_path, encoding="utf-8") as f:
            content = json.load(f)
    except ValueError as e:
        raise CheckpointError(f"{marker_path}: not valid JSON ({e})") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{marker_path}: expected a JSON object, found {type(content).__name__}")
    version = content.get("format_version", unversioned)
    if version != format_version:
        hint = (version_hints or {}).get(version)
        raise CheckpointError(f"{marker_path}: checkpoint format {version!r}{f' ({hint})' if hint else ''}; this "
                              f"code reads format {format_version}")
    for key in required:
        if key not in content:
            raise CheckpointError(f"{marker_path}: no {key!r} field")
    return content


def write_marker(directory: str, marker: str, content: Dict[str, Any], indent: int = 2) -> str:
    """Write the marker JSON into ``directory`` (a staging directory: the caller's atomic rename publishes it).

    Numpy scalars and tuples are written as numbers and lists."""
    path = os.path.join(directory, marker)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=indent, sort_keys=True, default=_json_default)
        f.write("\n")
    return path


# ------------------------------------------------------------------------------------------------ checking
def jsonable(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples -> lists, numpy scalars -> numbers), for comparisons."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (list, tuple, dict)):
        return value.item()  # a numpy (or torch) scalar, without importing numpy
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def config_differences(saved: Mapping[str, Any], config: Mapping[str, Any],
                       fields: Optional[Iterable[str]] = None) -> List[Tuple[str, Any, Any]]:
    """``(field, saved, given)`` of every field in both configurations (or in ``fields``) whose values differ."""
    keys = sorted(set(saved) & set(config)) if fields is None else \
        [k for k in fields if k in saved and k in config]
    return [(k, saved[k], config[k]) for k in keys if jsonable(saved[k]) != jsonable(config[k])]


def check_config(saved: Mapping[str, Any], config: Mapping[str, Any], where: str,
                 flags: Optional[Mapping[str, str]] = None, fields: Optional[Iterable[str]] = None) -> None:
    """Refuse a checkpoint of a differently shaped or configured model, naming EVERY differing field and the flag
    that sets it (``flags``: field -> how the user sets it; default ``--<field>``); ``where``: the marker file."""
    differing = [f"{key}: checkpoint {old!r}, flags {new!r} (set by {(flags or {}).get(key, f'--{key}')})"
                 for key, old, new in config_differences(saved, config, fields)]
    if differing:
        raise CheckpointError(f"{where}: the checkpoint's model differs from the one the flags describe; a checkpoint "
                              f"loads only into the same model. Differing: " + "; ".join(differing))


def warn_training_changes(saved: Mapping[str, Any], training: Mapping[str, Any], fields: Sequence[str],
                          where: str, consequence: str = "", stacklevel: int = 3) -> List[str]:
    """Warn (not refuse) when a resumed run changes training settings such as the batch size or learning rate;
    returns the changes as ``"<field> <old> -> <new>"``."""
    changed = [f"{k} {saved[k]} -> {training[k]}" for k in fields
               if k in saved and k in training and jsonable(saved[k]) != jsonable(training[k])]
    if changed:
        warnings.warn(f"{where}: resuming with {', '.join(changed)}; training goes on, but it no longer equals an "
                      f"uninterrupted run{consequence}", stacklevel=stacklevel)
    return changed


def other_runs(root: str, marker: str, resumed_from: Optional[str]) -> Tuple[List[Tuple[int, str]], bool]:
    """The checkpoints already in ``root``, and whether this run resumed from the newest of them.

    Checkpoints of another run in a save directory would interleave with ours, and resuming from the directory would
    pick whichever has the highest step: only the run resumed from the newest of them may add to it."""
    existing = list_checkpoints(root, marker)
    resumed_here = bool(existing) and resumed_from is not None and \
        os.path.realpath(resolve_checkpoint(resumed_from, marker)) == os.path.realpath(existing[-1][1])
    return existing, resumed_here


# ------------------------------------------------------------------------------------------------ removing
def remove_stale_temporaries(root: str) -> List[str]:
    """Remove ``.step_<N>.tmp-*`` directories under ``root``: saves a killed run did not finish (ours only)."""
    removed = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if STALE_PATTERN.match(name) and os.path.isdir(os.path.join(root, name)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


def prune_checkpoints(root: str, keep: int, marker: str,
                      remove: Optional[Callable[[str], Any]] = None) -> List[Tuple[int, str]]:
    """Remove all but the newest ``keep`` complete checkpoints under ``root`` (``keep`` 0: none), with ``remove``
    (default: delete the directory); returns the removed ``(step, path)``."""
    if keep <= 0:
        return []
    removed = list_checkpoints(root, marker)[:-keep]
    for _, path in removed:
        (remove or (lambda p: shutil.rmtree(p, ignore_errors=True)))(path)
    return removed


# ------------------------------------------------------------------------------------------------ when to save
class SavePolicy:
    """When a periodic checkpoint is due: every ``every_steps`` steps and/or after ``every_minutes``.

    A save is collective, so every process must give the same answer at the same step. The step rule is the same
    everywhere; the clock differs per process, so with several processes the minutes rule is decided only every
    ``check_every`` steps (no collective on the other steps) by ``agree(late) -> bool``, which the recipe implements
    with its framework's collective (any rank late, or rank 0's clock). With one process it is checked every step.

        >>> policy = SavePolicy(every_steps=3)
        >>> [s for s in range(1, 10) if policy.due(s)]
        [3, 6, 9]
    """

    def __init__(self, every_steps: Optional[int] = None, every_minutes: Optional[float] = None, keep: int = 2,
                 world_size: int = 1, agree: Optional[Callable[[bool], bool]] = None, check_every: int = 16):
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"--checkpoint_every_steps must be at least 1, got {every_steps}")
        if every_minutes is not None and not (every_minutes > 0 and math.isfinite(every_minutes)):
            raise ValueError(f"--checkpoint_every_minutes must be a positive number, got {every_minutes}")
        if keep is None or keep < 0:
            raise ValueError(f"--keep_checkpoints must be 0 (keep all) or more, got {keep}")
        if world_size > 1 and every_minutes and agree is None:
            raise ValueError("several processes need an agree() collective for --checkpoint_every_minutes")
        self.every_steps, self.every_minutes, self.keep = every_steps, every_minutes, keep
        self.world_size, self.agree, self.check_every = world_size, agree, check_every
        self._last_time = time.monotonic()

    def due(self, global_step: int) -> bool:
        """Whether a periodic checkpoint is due after ``global_step`` (collective every ``check_every`` steps when
        several processes save by the clock)."""
        if self.every_steps and global_step % self.every_steps == 0:
            return True
        if not self.every_minutes:
            return False
        if self.world_size > 1 and global_step % self.check_every:
            return False
        late = time.monotonic() - self._last_time >= self.every_minutes * 60.0
        return bool(self.agree(late)) if self.agree is not None else late

    def saved(self) -> None:
        """Restart the clock: a checkpoint was just written."""
        self._last_time = time.monotonic()
