"""Where Wide & Deep writes its checkpoints, and how it reads them back: the one place for both formats.

Training (``main.py``, :class:`Checkpointer`)::

    <--model_dir>/checkpoint/
        meta.json        written last (its presence marks a complete checkpoint): format version, global step
        ckpt.index       tf.train.Checkpoint of the model, both optimizers (FTRL, RMSprop, with their loss
        ckpt.data-*      scalers under AMP) and the step counter

One checkpoint, replaced after every epoch (and every ``--checkpoint_every_steps``), as NVIDIA's recipe keeps one;
``--use_checkpoint`` resumes from it exactly (data position from the step).

MovieLens (``python -m wide_deep.movielens.train``, :func:`write_snapshot`), HugeCTR's ``snapshot`` cadence::

    <--model_dir>/snapshot_<step>/
        meta.json        written last: format version, step, checkpoint prefix
        ckpt.*           tf.train.Checkpoint of the model and Adam

Both are written into a staging directory and renamed into place when complete (``recsys_common.io
.atomic_directory``: every file fsync'd; a crash leaves the previous checkpoint); a directory of that name holding
files this recipe did not write is refused, never deleted. The marker is read and checked through
``recsys_common.checkpoints`` (checkpoints written before it carried a ``format_version`` read as version 1).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from recsys_common import checkpoints as catalogue
from recsys_common.checkpoints import CheckpointError
from recsys_common.io import atomic_directory

MARKER = "meta.json"
FORMAT_VERSION = 1
TOOL = "wide_deep.checkpoint"
SNAPSHOT_TOOL = "wide_deep.movielens.train"
PREFIX = "ckpt"

__all__ = ["Checkpointer", "CheckpointError", "checkpoint_prefix", "write_checkpoint", "read_checkpoint",
           "write_snapshot", "restore_snapshot"]


def write_checkpoint(path: str, objects: Dict[str, Any], meta: Dict[str, Any], tool: str = TOOL) -> str:
    """``tf.train.Checkpoint(**objects)`` and the marker (``meta`` + format version, last) into ``path``,
    atomically; returns ``path``."""
    import tensorflow as tf
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_directory(path, overwrite=True, tool=tool, marker=MARKER) as staging:
        tf.train.Checkpoint(**objects).write(os.path.join(staging, PREFIX))
        catalogue.write_marker(staging, MARKER, {"format_version": FORMAT_VERSION, "checkpoint": PREFIX, **meta})
    return path


def read_meta(path: str) -> Dict[str, Any]:
    """The checked marker of checkpoint directory ``path`` (raises :class:`CheckpointError` naming the file)."""
    return catalogue.read_marker(path, MARKER, FORMAT_VERSION, required=("step",), unversioned=1)


def read_checkpoint(path: str, objects: Dict[str, Any]) -> Dict[str, Any]:
    """Restore ``objects`` from checkpoint directory ``path`` (every object must match); returns its marker."""
    import tensorflow as tf
    meta = read_meta(path)
    status = tf.train.Checkpoint(**objects).read(os.path.join(path, meta.get("checkpoint", PREFIX)))
    status.assert_existing_objects_matched()
    return meta


def checkpoint_prefix(path: str) -> str:
    """The ``tf.train.Checkpoint`` prefix in ``path``: a training ``--model_dir``, its ``checkpoint/`` directory, or a
    MovieLens ``snapshot_<step>/`` directory. Raises FileNotFoundError naming what was looked for."""
    for directory in (path, os.path.join(path, "checkpoint")):
        if os.path.isfile(os.path.join(directory, MARKER)):
            return os.path.join(directory, read_meta(directory).get("checkpoint", PREFIX))
    raise FileNotFoundError(f"--checkpoint-dir {path}: no complete checkpoint (no {MARKER} in it or in "
                            f"{os.path.join(path, 'checkpoint')}); pass the training --model_dir or a snapshot_<step>/")


class Checkpointer:
    """``model_dir/checkpoint/``: model, both optimizers, the step and the dropout masks' random streams, written
    atomically (rank 0 calls ``save``).

    Args:
        model_dir: the training's ``--model_dir``.
        model, wide_opt, deep_opt, step_var: what training changes.
        random_streams: ``{name: tf.random.Generator}`` (``DeepPart.dropout_generators``): saved so that a resumed
            run draws the masks the uninterrupted run would have. A checkpoint written before they were saved (no
            ``random_streams`` in its marker) restores without them: the masks then start afresh, as they did.
    """

    def __init__(self, model_dir: str, model, wide_opt, deep_opt, step_var, random_streams=None):
        self.directory = os.path.join(model_dir, "checkpoint")
        self.objects = {"model": model, "wide_optimizer": wide_opt, "deep_optimizer": deep_opt, "step": step_var}
        self.random_streams = dict(random_streams or {})

    def _with_streams(self) -> Dict[str, Any]:
        import tensorflow as tf
        return {**self.objects, "random_streams": tf.train.Checkpoint(**self.random_streams)}

    def exists(self) -> bool:
        return os.path.exists(os.path.join(self.directory, MARKER))

    def save(self, step: int) -> None:
        if self.random_streams:
            write_checkpoint(self.directory, self._with_streams(), {"step": int(step), "random_streams": True})
        else:
            write_checkpoint(self.directory, self.objects, {"step": int(step)})

    def restore(self) -> int:
        """Restores the last complete checkpoint; returns its step. Raises FileNotFoundError naming the directory."""
        if not self.exists():
            raise FileNotFoundError(f"--use_checkpoint: no complete checkpoint in {self.directory} "
                                    f"(no {MARKER}); train first or fix --model_dir")
        saved_streams = bool(read_meta(self.directory).get("random_streams"))
        objects = self._with_streams() if saved_streams and self.random_streams else self.objects
        return int(read_checkpoint(self.directory, objects)["step"])


def write_snapshot(model_dir: str, step: int, model, optimizer) -> str:
    """``model_dir/snapshot_<step>/`` with a tf.train.Checkpoint of model and Adam state, staged then renamed."""
    return write_checkpoint(os.path.join(model_dir, f"snapshot_{step}"), {"model": model, "optimizer": optimizer},
                            {"step": int(step)}, tool=SNAPSHOT_TOOL)


def restore_snapshot(path: str, model, optimizer=None) -> int:
    """Load a snapshot written by :func:`write_snapshot` into ``model`` (and ``optimizer``); returns its step."""
    if not os.path.isfile(os.path.join(path, MARKER)):
        raise FileNotFoundError(f"{path}: not a complete snapshot (no {MARKER})")
    objects: Dict[str, Optional[Any]] = {"model": model} if optimizer is None else \
        {"model": model, "optimizer": optimizer}
    return int(read_checkpoint(path, objects)["step"])
