"""NCF checkpoint -> Triton model repository (ONNX and/or TorchScript), with the seed's deployer flags.

    python deployment/deploy.py --load_checkpoint_path /tmp/ncf_quickstart/checkpoints/model.pth \
        --save-dir /tmp/ncf_triton --deploy_cpu                       # ncf-onnx (ONNX) and ncf-ts (torch.jit.script)
    python deployment/deploy.py --onnx --load_checkpoint_path model.pth --save-dir repo \
        --triton-max-batch-size 65536 --triton-dyn-batching-delay 0.5 --triton-engine-count 2

Format flags as in NVIDIA's PyTorch DLRM ``triton/deployer.py``: ``--ts-script``, ``--ts-trace``, ``--onnx``; here
they combine (``--onnx --ts-trace`` writes both models) and none means ``--onnx --ts-script``. Each format is one
Triton model, ``<--triton-model-name>-onnx`` / ``<--triton-model-name>-ts``, served side by side from one
repository. Inputs ``user`` and ``item`` (INT64 ``[1]`` per row), output ``probability`` (FP32 ``[1]``,
``sigmoid`` of the logit). The export, the ``--triton-*`` flags and the format rule are
``recsys_common.serving.torch_export`` / ``triton_options``, shared with PyTorch DLRM's deployer: the batching delay
is also accepted in microseconds (``--dynamic-batching-delay-us``, ``--max-queue-delay-us``), and with dynamic
batching on the preferred batch sizes are half and all of ``--triton-max-batch-size`` (NVIDIA's deployer).

The model configuration comes from the checkpoint (``ncf.py`` records it); ``--model``, ``-f``, ``--layers``,
``--dropout``, ``--n_users``, ``--n_items`` are needed only for a bare state dict (NVIDIA's ``model.pth``) and,
when given, must match the checkpoint. Without a checkpoint (``--random_weights``) the model is built from the
flags, for speed tests. After export, every written model is run on ``--check_rows`` random rows against the eager
model (the seed's "conversion correctness test"); the largest absolute difference per model is printed (JSON).

``deployment/deployer.py`` (NVIDIA's name) runs this file. The directory is ``deployment/``, not the seed's ``triton/``: a directory named ``triton`` next to ``ncf.py`` is
imported by torch as the (absent) OpenAI Triton compiler package and ``torch.optim.Adam`` then fails on CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.dirname(HERE)
for _path in (HERE, RECIPE, os.path.join(os.path.dirname(os.path.dirname(RECIPE)), "common")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

from neumf import MODEL_NAMES, build_model, serving  # noqa: E402
from neumf.checkpointing import CheckpointError  # noqa: E402
from neumf.recommend import DEFAULT_DROPOUT, DEFAULT_FACTORS, DEFAULT_LAYERS, load_model  # noqa: E402
from recsys_common.cli import run_main  # noqa: E402
from recsys_common.serving import torch_export  # noqa: E402
from recsys_common.serving.torch_export import add_format_arguments  # noqa: E402
from recsys_common.serving.raw_ensemble import add_raw_ensembles, add_raw_features_argument  # noqa: E402
from recsys_common.serving.triton_options import add_triton_arguments, triton_options  # noqa: E402

TOOL_PATH = "PyTorch/NCF/deployment/deployer.py"   # the owner recorded in the repository (--overwrite replaces its files)


class DeployError(ValueError):
    """Flags that cannot produce a model repository; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Export an NCF checkpoint to a Triton model repository")
    add_format_arguments(p)
    add_triton_arguments(p, default_model_name="ncf",
                         max_batch_size_help="max_batch_size in config.pbtxt: rows per request (one user's 101 "
                                             "candidates or all its items fit in one request)")
    model = p.add_argument_group("model")
    model.add_argument("--load_checkpoint_path", "--model_checkpoint", dest="load_checkpoint_path", default=None,
                       help="checkpoint written by ncf.py (model.pth / last.pth) or a bare state dict")
    add_raw_features_argument(model)
    model.add_argument("--random_weights", action="store_true",
                       help="no checkpoint: a randomly initialised model from the flags (speed tests)")
    given = "; checked against the checkpoint when given"
    model.add_argument("--model", choices=MODEL_NAMES, default=None, help="as ncf.py (bare state dict: neumf)" + given)
    model.add_argument("-f", "--factors", type=int, default=None, help="as ncf.py (bare state dict: 64)" + given)
    model.add_argument("--layers", type=int, nargs="+", default=None,
                       help="as ncf.py (bare state dict: 256 256 128 64)" + given)
    model.add_argument("--dropout", type=float, default=None,
                       help="as ncf.py (bare state dict: 0.5; it only decides the layer names)" + given)
    model.add_argument("--n_users", type=int, default=None, help="users (bare state dict: from the shapes)" + given)
    model.add_argument("--n_items", type=int, default=None, help="items (bare state dict: from the shapes)" + given)
    model.add_argument("--opset", type=int, default=torch_export.ONNX_OPSET, help="ONNX opset")
    model.add_argument("--check_rows", type=int, default=4096,
                       help="rows of the exported-vs-eager check after export (0: skip)")
    return p


def random_model(model_name: Optional[str], factors: Optional[int], layers: Optional[List[int]],
                 dropout: Optional[float], n_users: Optional[int], n_items: Optional[int]):
    """(model, config) randomly initialised from the flags; ``--n_users`` and ``--n_items`` are required."""
    if n_users is None or n_items is None:
        raise DeployError("--random_weights needs --n_users and --n_items")
    config = {"model": model_name or "neumf", "num_users": n_users, "num_items": n_items,
              "factors": factors if factors is not None else DEFAULT_FACTORS,
              "layers": list(layers) if layers is not None else list(DEFAULT_LAYERS),
              "dropout": dropout if dropout is not None else DEFAULT_DROPOUT}
    torch.manual_seed(0)
    net = build_model(config["model"], config["num_users"], config["num_items"], config["factors"],
                      config["layers"], config["dropout"])
    return net.eval(), config


def main(argv: Optional[List[str]] = None) -> Dict:
    """Write the repository; returns ``{"models": [dirs], "max_abs_diff": {model: diff}, "config": {...}}``. Raises
    :data:`INPUT_ERRORS` (naming the flag or file) for flags, a checkpoint or an output directory it cannot use."""
    args = build_parser().parse_args(argv)
    formats = torch_export.selected_formats(args.onnx, args.ts_script, args.ts_trace)
    options = triton_options(args)
    if args.load_checkpoint_path and args.random_weights:
        raise DeployError("--load_checkpoint_path and --random_weights exclude each other")
    if not args.load_checkpoint_path and not args.random_weights:
        raise DeployError("--load_checkpoint_path is required (or --random_weights for a speed test)")
    if args.check_rows < 0:
        raise DeployError("--check_rows must be >= 0")
    if args.load_checkpoint_path:
        model, config = load_model(args.load_checkpoint_path, model=args.model, factors=args.factors,
                                   layers=args.layers, dropout=args.dropout, num_users=args.n_users,
                                   num_items=args.n_items)
    else:
        model, config = random_model(args.model, args.factors, args.layers, args.dropout, args.n_users,
                                     args.n_items)
    module = serving.serving_module(model)
    model_dirs = torch_export.write_repository(module, serving.sidecar(config, args.load_checkpoint_path),
                                               formats, options, tool=TOOL_PATH, opset=args.opset)
    diffs = {}
    if args.check_rows:
        diffs = torch_export.check_exported(
            module, model_dirs, options.version,
            serving.example_inputs(config["num_users"], config["num_items"], args.check_rows, seed=1),
            serving.OUTPUT_NAME)
    raw_models = add_raw_ensembles(model_dirs, args.raw_features_from)
    return {"models": model_dirs, "raw_models": raw_models, "max_abs_diff": diffs, "config": config}


INPUT_ERRORS = (DeployError, CheckpointError, ValueError, FileExistsError)

if __name__ == "__main__":
    run_main(main, prog="deployer.py", input_errors=INPUT_ERRORS,
             report=lambda result: print(json.dumps(result, indent=1)))
