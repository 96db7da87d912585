"""NCF checkpoint -> Triton model repository (ONNX and/or TorchScript), with the seed's deployer flags.

    python deployment/deployer.py --load_checkpoint_path /tmp/ncf_quickstart/checkpoints/model.pth \
        --save-dir /tmp/ncf_triton --deploy_cpu                       # ncf-onnx (ONNX) and ncf-ts (torch.jit.script)
    python deployment/deployer.py --onnx --load_checkpoint_path model.pth --save-dir repo \
        --triton-max-batch-size 65536 --triton-dyn-batching-delay 0.5 --triton-engine-count 2

Format flags as in NVIDIA's PyTorch DLRM ``triton/deployer.py``: ``--ts-script``, ``--ts-trace``, ``--onnx``; here
they combine (``--onnx --ts-trace`` writes both models) and none means ``--onnx --ts-script``. Each format is one
Triton model, ``<--triton-model-name>-onnx`` / ``<--triton-model-name>-ts``, served side by side from one
repository. Inputs ``user`` and ``item`` (INT64 ``[1]`` per row), output ``probability`` (FP32 ``[1]``,
``sigmoid`` of the logit).

The model configuration comes from the checkpoint (``ncf.py`` records it); ``--model``, ``-f``, ``--layers``,
``--dropout``, ``--n_users``, ``--n_items`` are needed only for a bare state dict (NVIDIA's ``model.pth``) and,
when given, must match the checkpoint. Without a checkpoint (``--random_weights``) the model is built from the
flags, for speed tests. After export, every written model is run on ``--check_rows`` random rows against the eager
model (the seed's "conversion correctness test"); the largest absolute difference per model is printed (JSON).

The directory is ``deployment/``, not the seed's ``triton/``: a directory named ``triton`` next to ``ncf.py`` is
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ncf_export  # noqa: E402
from ncf import CheckpointError  # noqa: E402
from neumf import MODEL_NAMES, build_model  # noqa: E402
from recommend import DEFAULT_DROPOUT, DEFAULT_FACTORS, DEFAULT_LAYERS, load_model  # noqa: E402


class DeployError(ValueError):
    """Flags that cannot produce a model repository; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Export an NCF checkpoint to a Triton model repository")
    fmt = p.add_argument_group("formats (any combination of --onnx with one TorchScript method; none: "
                               "--onnx --ts-script)")
    fmt.add_argument("--ts-script", action="store_true", help="TorchScript model via torch.jit.script")
    fmt.add_argument("--ts-trace", action="store_true", help="TorchScript model via torch.jit.trace")
    fmt.add_argument("--onnx", action="store_true", help="ONNX model via torch.onnx.export")
    triton = p.add_argument_group("triton related flags (NVIDIA's names)")
    triton.add_argument("--triton-model-name", default="ncf",
                        help="model name prefix: <name>-onnx and <name>-ts")
    triton.add_argument("--triton-model-version", type=int, default=1, help="version directory")
    triton.add_argument("--triton-max-batch-size", type=int, default=65536,
                        help="max_batch_size in config.pbtxt: rows per request (one user's 101 candidates "
                             "or all its items fit in one request)")
    triton.add_argument("--triton-dyn-batching-delay", type=float, default=0.0,
                        help="dynamic batching queue delay in ms; 0 = no dynamic batching")
    triton.add_argument("--triton-engine-count", type=int, default=1, help="instance_group count")
    triton.add_argument("--save-dir", "--model-repository", dest="save_dir", default="./triton_models",
                        help="the Triton model repository to write")
    triton.add_argument("--deploy_cpu", action="store_true",
                        help="instance_group kind KIND_CPU (default KIND_GPU, as NVIDIA's deployer)")
    triton.add_argument("--overwrite", action="store_true",
                        help="replace this tool's earlier models in a non-empty --save-dir (other files stay)")
    model = p.add_argument_group("model")
    model.add_argument("--load_checkpoint_path", "--model_checkpoint", dest="load_checkpoint_path", default=None,
                       help="checkpoint written by ncf.py (model.pth / last.pth) or a bare state dict")
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
    model.add_argument("--opset", type=int, default=ncf_export.ONNX_OPSET, help="ONNX opset")
    model.add_argument("--check_rows", type=int, default=4096,
                       help="rows of the exported-vs-eager check after export (0: skip)")
    return p


def selected_formats(onnx: bool, ts_script: bool, ts_trace: bool) -> List[str]:
    """The formats to write, in a fixed order; none selected means ONNX and torch.jit.script."""
    if ts_script and ts_trace:
        raise DeployError("--ts-script and --ts-trace both write the TorchScript model (<name>-ts): choose one")
    formats = [f for f, on in (("onnx", onnx), ("ts-script", ts_script), ("ts-trace", ts_trace)) if on]
    return formats or ["onnx", "ts-script"]


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


def check_exported(model: torch.nn.Module, model_dirs: List[str], version: int, num_users: int, num_items: int,
                   rows: int) -> Dict[str, float]:
    """Largest |exported - eager| probability per written model on ``rows`` random rows (onnxruntime for ONNX,
    torch.jit.load for TorchScript)."""
    inputs = ncf_export.example_inputs(num_users, num_items, rows, seed=1)
    with torch.no_grad():
        eager = ncf_export.serving_module(model)(torch.from_numpy(inputs["user"]),
                                                torch.from_numpy(inputs["item"])).numpy()
    diffs = {}
    for model_dir in model_dirs:
        version_dir = os.path.join(model_dir, str(version))
        if os.path.isfile(os.path.join(version_dir, "model.onnx")):
            import onnxruntime as ort
            session = ort.InferenceSession(os.path.join(version_dir, "model.onnx"),
                                           providers=["CPUExecutionProvider"])
            got = session.run([ncf_export.OUTPUT_NAME], inputs)[0]
        else:
            scripted = torch.jit.load(os.path.join(version_dir, "model.pt"), map_location="cpu")
            with torch.no_grad():
                got = scripted(torch.from_numpy(inputs["user"]), torch.from_numpy(inputs["item"])).numpy()
        diffs[os.path.basename(model_dir)] = float(np.abs(got - eager).max())
    return diffs


def main(argv: Optional[List[str]] = None) -> Dict:
    """Write the repository; returns ``{"models": [dirs], "max_abs_diff": {model: diff}, "config": {...}}``."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        formats = selected_formats(args.onnx, args.ts_script, args.ts_trace)
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
        model_dirs = ncf_export.write_repository(
            model, config, args.save_dir, formats, base_name=args.triton_model_name,
            version=args.triton_model_version, max_batch_size=args.triton_max_batch_size,
            dynamic_batching_delay_ms=args.triton_dyn_batching_delay, instance_count=args.triton_engine_count,
            instance_kind="KIND_CPU" if args.deploy_cpu else "KIND_GPU", overwrite=args.overwrite,
            checkpoint=args.load_checkpoint_path, opset=args.opset)
    except (DeployError, CheckpointError, ValueError, FileExistsError) as err:
        print(f"deployer.py: error: {err}", file=sys.stderr)
        raise SystemExit(2)
    diffs = {}
    if args.check_rows:
        diffs = check_exported(model, model_dirs, args.triton_model_version, config["num_users"],
                               config["num_items"], args.check_rows)
    result = {"models": model_dirs, "max_abs_diff": diffs, "config": config}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
