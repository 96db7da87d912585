"""Write one of our NeuMF checkpoints as NVIDIA's recipe saves its ``model.pth``: a bare state dict in NVIDIA's names.

    python export_nvidia_checkpoint.py --input /data/checkpoints/model.pth --output /data/nvidia/model.pth

NVIDIA's ``ncf.py --load_checkpoint_path`` (and its ``inference.py``) then load it with the same ``-f`` /
``--layers`` flags. The other direction needs no tool: ``ncf.py`` and ``inference.py`` load NVIDIA's bare
``model.pth`` directly (:func:`neumf.model.from_nvidia_state_dict`). Only NeuMF maps (NVIDIA has no GMF / MLP models).
The output is written atomically, and an existing file is never replaced.
"""
from __future__ import annotations

import argparse
import os
from typing import List, Optional

import torch

from neumf import to_nvidia_state_dict
from neumf.checkpointing import CheckpointError, read_checkpoint
from recsys_common.cli import run_main
from recsys_common.io import atomic_path


def main(argv: Optional[List[str]] = None) -> str:
    """Writes NVIDIA's bare state dict; returns its path. Raises ``CheckpointError`` on bad input."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="checkpoint written by ncf.py (model.pth or last.pth)")
    p.add_argument("--output", required=True, help="where to write NVIDIA's bare state dict (must not exist)")
    args = p.parse_args(argv)
    if os.path.lexists(args.output):
        raise CheckpointError(f"{args.output}: exists; refusing to overwrite it (choose a new --output)")
    state = read_checkpoint(args.input)["model"]
    try:
        nvidia = to_nvidia_state_dict(state)
    except ValueError as err:
        raise CheckpointError(f"{args.input}: {err}") from err
    directory = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(directory, exist_ok=True)
    with atomic_path(args.output) as tmp:
        torch.save(nvidia, tmp)
    print(f"export_nvidia_checkpoint.py: {len(nvidia)} tensors in NVIDIA's names -> {args.output}")
    return args.output


if __name__ == "__main__":
    run_main(main, prog="export_nvidia_checkpoint.py", input_errors=(CheckpointError,))
