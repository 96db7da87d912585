"""Train the MovieLens CTR model of the HugeCTR notebook with this recipe's model code, evaluate AUC, export it.

    python -m wide_deep.movielens.etl   --input_dir /data/ml-100k --output_dir /data/movielens
    python -m wide_deep.movielens.train --dataset_path /data/movielens --model_dir /tmp/ml_snapshots \\
        --export_dir /tmp/ml_export --max_iter 2000 --display 100 --eval_interval 200 --snapshot 1900

The model is the deep part of the recipe's Wide & Deep (:class:`wide_deep.model.network.DeepOnlyModel`, built by
:func:`wide_deep.model.network.build_movielens_model` from :func:`wide_deep.model.config.movielens_config`), configured
as the notebook's network: an embedding of width ``--embedding_dim`` (16) per categorical (``userId``, ``movieId``
and the multi-hot ``genres`` pooled with ``--combiner sum``), concatenated (3 x 16 = 48 values), then Dense 128
ReLU, Dense 128 ReLU, Dense 1; loss binary cross-entropy on the logit; Adam (``--learning_rate`` 0.001).

Like HugeCTR's ``model.fit(max_iter, display, eval_interval, snapshot)``, training runs ``--max_iter`` steps over
the repeated, shuffled training set (non-epoch mode) and
    every ``--display`` steps   prints the mean loss and the speed;
    every ``--eval_interval``   computes the AUC on valid/ (exact, all rows unless ``--max_eval_batches``);
    every ``--snapshot`` steps  writes ``model_dir/snapshot_<step>/`` (weights + Adam state, tf.train.Checkpoint;
                                staged and renamed: a crash never leaves a half-written snapshot);
then exports for serving to ``--export_dir``:
    1/model.savedmodel/   SavedModel, signature ``serving_default``: userId [N] int64, movieId [N] int64,
                          genres [N, max_hotness] int64 padded with -1 -> probability [N] float32
    1/movielens.json      the model graph (what HugeCTR's ``graph_to_json`` gives): solver and optimizer settings,
                          inputs with shapes and cardinalities, layers with bottom/top names, output shapes and
                          parameter counts.
Every line printed also goes, as DLLogger JSON, to ``--log_json``.

``main(argv)`` returns the summary dict (``final_auc``, ``auc_history``, ``samples_per_second`` ...).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from recsys_common.cli import run_main
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory
from recsys_common.logger import Logger

# The snapshots' format lives with the recipe's other checkpoint format (wide_deep/checkpointing.py).
from ..checkpointing import write_snapshot
from ..data.movielens import model_feature_names, split_rows, training_batches
from ..model.config import movielens_config
from ..model.network import build_movielens_model
from .etl import LABEL, LABEL_CHANNEL, MULTIHOT_CHANNEL, ONEHOT_CHANNEL, SPEC_NAME
from .evaluation import evaluate_auc_parts

TOOL = "wide_deep.movielens.train"
GRAPH_JSON = "movielens.json"
SAVEDMODEL_DIR = "model.savedmodel"
SNAPSHOT_META = "meta.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m " + TOOL, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset_path", required=True, help="output directory of wide_deep.movielens.etl")
    p.add_argument("--model_dir", default=None, help="directory of the periodic snapshots (none if not given)")
    p.add_argument("--export_dir", default=None, help="directory of the exported model (none if not given)")
    p.add_argument("--log_json", default=None, help="DLLogger JSON log file (none if not given)")
    p.add_argument("--batch_size", type=int, default=2048, help="training batch (HugeCTR solver batchsize)")
    p.add_argument("--eval_batch_size", type=int, default=2048, help="evaluation batch (batchsize_eval)")
    p.add_argument("--max_eval_batches", type=int, default=0, help="evaluate on this many batches (0: all of valid)")
    p.add_argument("--max_iter", type=int, default=2000, help="training steps")
    p.add_argument("--display", type=int, default=100, help="print the loss every N steps")
    p.add_argument("--eval_interval", type=int, default=200, help="evaluate AUC every N steps (and at the end)")
    p.add_argument("--snapshot", type=int, default=1900, help="write a snapshot every N steps (needs --model_dir)")
    p.add_argument("--learning_rate", type=float, default=0.001, help="Adam learning rate")
    p.add_argument("--embedding_dim", type=int, default=16, help="embedding width of every categorical")
    p.add_argument("--hidden_units", type=int, nargs="+", default=[128, 128],
                   help="hidden ReLU layers before the final Dense(1)")
    p.add_argument("--combiner", choices=["sum", "mean"], default="sum", help="pooling of the multi-hot genres")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and shuffling")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --export_dir")
    return p


# ------------------------------------------------------------------------------------------------- snapshot/export
def graph_json(model, spec: FeatureSpec, solver: Dict[str, object], optimizer: Dict[str, object]) -> Dict[str, object]:
    """The model graph in the spirit of HugeCTR's ``graph_to_json``, read off the built model's variables.

    Keys: ``solver``, ``optimizer``, ``inputs`` (name, kind, dtype, shape, cardinality, max_hotness), ``label``,
    ``layers`` (type, name, bottom, top, output_shape, and per type: vocabulary size / width / combiner, units /
    activation, ``params``), ``total_params`` (= the model's parameter count), ``serving`` (signature).
    """
    deep, config = model.deep, model.deep.config
    inputs, layers, embedding_tops = [], [], []
    for name, card in config.categorical.items():
        multihot = name in config.multihot
        shape = [None, config.max_hotness[name]] if multihot else [None]
        inputs.append({"name": name, "kind": "multihot" if multihot else "onehot", "dtype": "int64", "shape": shape,
                       "cardinality": int(card), **({"max_hotness": config.max_hotness[name]} if multihot else {})})
        table = deep.tables[name]
        top = f"embedding_{name}"
        layers.append({"type": "Embedding", "name": top, "bottom": [name], "top": top,
                       "vocabulary_size": int(table.shape[0]), "embedding_vec_size": int(table.shape[1]),
                       "combiner": config.combiner if multihot else None,
                       "output_shape": [None, int(table.shape[1])], "params": int(np.prod(table.shape))})
        embedding_tops.append(top)
    width = sum(int(deep.tables[n].shape[1]) for n in config.categorical)
    layers.append({"type": "Concat", "name": "concat", "bottom": embedding_tops, "top": "concat",
                   "output_shape": [None, width], "params": 0})
    bottom = "concat"
    for i, dense in enumerate(list(deep.hidden) + [deep.head]):
        kernel, bias = dense.kernel, dense.bias
        top = f"fc{i + 1}"
        layers.append({"type": "InnerProduct", "name": dense.name, "bottom": [bottom], "top": top,
                       "num_output": int(kernel.shape[1]), "activation": dense.get_config()["activation"],
                       "output_shape": [None, int(kernel.shape[1])],
                       "params": int(np.prod(kernel.shape)) + int(np.prod(bias.shape))})
        bottom = top
    layers.append({"type": "BinaryCrossEntropyLoss", "name": "loss", "bottom": [bottom, LABEL], "top": "loss",
                   "output_shape": [], "params": 0})
    return {"format": "wide_deep.movielens graph v1", "solver": solver, "optimizer": optimizer,
            "inputs": inputs, "label": {"name": LABEL, "dtype": "int8", "meaning": spec.metadata.get("label")},
            "layers": layers, "total_params": int(sum(l["params"] for l in layers)),
            "serving": {"savedmodel": SAVEDMODEL_DIR, "signature": "serving_default",
                        "inputs": [i["name"] for i in inputs], "output": "probability"}}


def export_model(export_dir: str, model, graph: Dict[str, object], overwrite: bool = False) -> str:
    """Write ``export_dir/1/model.savedmodel`` and ``export_dir/1/movielens.json`` (staged, then moved in)."""
    config = model.deep.config
    specs = {n: tf.TensorSpec([None], tf.int64, name=n) for n in config.onehot}
    specs.update({n: tf.TensorSpec([None, config.max_hotness[n]], tf.int64, name=n) for n in config.multihot})

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[specs])
        def serve(self, features):
            ids = {k: tf.cast(v, tf.int32) for k, v in features.items()}
            return {"probability": tf.sigmoid(self.model(ids, training=False))}

    module = Serving()
    with atomic_directory(export_dir, overwrite=overwrite, tool=TOOL, marker=os.path.join("1", GRAPH_JSON)) as staging:
        version = os.path.join(staging, "1")
        os.makedirs(version)
        tf.saved_model.save(module, os.path.join(version, SAVEDMODEL_DIR),
                            signatures={"serving_default": module.serve})
        with open(os.path.join(version, GRAPH_JSON), "w") as f:
            json.dump(graph, f, indent=2)
    return os.path.join(export_dir, "1")


# -------------------------------------------------------------------------------------------------------- training
def train(dataset_path: str, *, model_dir: Optional[str] = None, export_dir: Optional[str] = None,
          log_json: Optional[str] = None, batch_size: int = 2048, eval_batch_size: int = 2048,
          max_eval_batches: int = 0, max_iter: int = 2000, display: int = 100, eval_interval: int = 200,
          snapshot: int = 1900, learning_rate: float = 0.001, embedding_dim: int = 16,
          hidden_units: Sequence[int] = (128, 128), combiner: str = "sum", seed: int = 0,
          overwrite: bool = False, stdout: bool = True) -> Dict[str, object]:
    """Train, evaluate, snapshot and export (see the module docstring); returns the summary dict."""
    for flag, value in (("--batch_size", batch_size), ("--eval_batch_size", eval_batch_size),
                        ("--max_iter", max_iter), ("--display", display), ("--eval_interval", eval_interval),
                        ("--snapshot", snapshot), ("--embedding_dim", embedding_dim)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if export_dir:
        check_output_directory(export_dir, overwrite)   # refuse before training, not after
    spec, rows_train, rows_valid = read_dataset(dataset_path)
    run = Run(spec, batch_size, eval_batch_size, max_eval_batches, max_iter, display, eval_interval, snapshot,
              model_dir)
    tf.keras.utils.set_random_seed(seed)
    model = build_movielens_model(movielens_config(spec, embedding_dim, hidden_units, combiner), seed)
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    solver = {"batchsize": batch_size, "batchsize_eval": eval_batch_size, "max_iter": max_iter, "display": display,
              "eval_interval": eval_interval, "snapshot": snapshot, "max_eval_batches": max_eval_batches,
              "seed": seed}
    opt_json = {"type": "Adam", "learning_rate": learning_rate, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    log = Logger(log_json, stdout=stdout)
    log.log_parameters({"dataset_path": dataset_path, **solver, "optimizer": opt_json, "embedding_dim": embedding_dim,
                        "hidden_units": list(hidden_units), "combiner": combiner,
                        "rows_train": rows_train, "rows_valid": rows_valid,
                        "total_params": int(model.count_params())})
    summary = fit(run, model, optimizer, training_dataset(spec, batch_size, seed), log)
    graph = graph_json(model, spec, solver, opt_json)
    if export_dir:
        summary["export"] = export_model(export_dir, model, graph, overwrite=overwrite)
    log.log_summary({k: v for k, v in summary.items() if k != "auc_history"})
    log.close()
    summary["model"], summary["graph"] = model, graph
    return summary


def read_dataset(dataset_path: str):
    """``(spec, training rows, validation rows)`` of an ETL output; ValueError when it is not one or a split is
    empty."""
    spec = FeatureSpec.from_yaml(os.path.join(dataset_path, SPEC_NAME), check_files=True)
    for channel in (LABEL_CHANNEL, ONEHOT_CHANNEL):
        if not spec.channel_spec.get(channel):
            raise ValueError(f"{spec.origin}: channel {channel!r} is empty; is this a wide_deep.movielens.etl output?")
    rows_train, rows_valid = split_rows(spec, "train"), split_rows(spec, "test")
    if not rows_train or not rows_valid:
        raise ValueError(f"{spec.origin}: {'train' if not rows_train else 'test'} has no rows")
    return spec, rows_train, rows_valid


@dataclass(frozen=True)
class Run:
    """The cadence of :func:`fit` (HugeCTR's ``fit(max_iter, display, eval_interval, snapshot)``) and its data."""
    spec: Any
    batch_size: int
    eval_batch_size: int
    max_eval_batches: int
    max_iter: int
    display: int
    eval_interval: int
    snapshot: int
    model_dir: Optional[str]


def training_dataset(spec: FeatureSpec, batch_size: int, seed: int):
    """Non-epoch mode, as HugeCTR's repeat_dataset=True: the shuffled training set repeats until max_iter, read a
    part at a time (memory does not grow with the number of ratings), as a ``tf.data`` pipeline."""
    multihot = spec.channel_spec.get(MULTIHOT_CHANNEL, [])
    signature = {n: tf.TensorSpec([batch_size] + ([spec.max_hotness(n)] if n in multihot else []), tf.int32)
                 for n in model_feature_names(spec)}
    signature[LABEL] = tf.TensorSpec([batch_size], tf.float32)
    return tf.data.Dataset.from_generator(lambda: training_batches(spec, batch_size, seed),
                                          output_signature=signature).prefetch(2)


def fit(run: Run, model, optimizer, dataset, log: Logger) -> Dict[str, object]:
    """``run.max_iter`` steps: each step -> the loss every ``display`` steps -> the AUC every ``eval_interval`` (and
    at the end) -> a snapshot every ``snapshot`` steps (with ``model_dir``); returns the summary."""
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    names = model_feature_names(run.spec)
    auc_history: List[Dict[str, float]] = []
    losses, train_seconds, window_start = [], 0.0, time.perf_counter()
    snapshots = []
    for step, batch in enumerate(dataset.take(run.max_iter), start=1):
        y = batch.pop(LABEL)
        losses.append(train_step(batch, y))
        if step % run.display == 0 or step == run.max_iter:
            mean_loss = float(np.mean([float(l) for l in losses]))   # fetch only here: no sync every step
            seconds = time.perf_counter() - window_start
            train_seconds += seconds
            log.log(step=(step,), data={"loss": mean_loss, "iters": len(losses), "seconds": seconds,
                                        "samples_per_second": len(losses) * run.batch_size / seconds})
            losses, window_start = [], time.perf_counter()
        if step % run.eval_interval == 0 or step == run.max_iter:
            t = time.perf_counter()
            auc = evaluate_auc_parts(model, run.spec, names, run.eval_batch_size, run.max_eval_batches)
            auc_history.append({"step": step, "auc": auc})
            log.log(step=(step,), data={"eval_auc": auc, "eval_seconds": time.perf_counter() - t})
            window_start += time.perf_counter() - t   # evaluation time is not training time
        if run.model_dir and step % run.snapshot == 0:
            t = time.perf_counter()
            snapshots.append(write_snapshot(run.model_dir, step, model, optimizer))
            log.log(step=(step,), data={"snapshot": snapshots[-1]})
            window_start += time.perf_counter() - t
    return {"final_auc": auc_history[-1]["auc"], "auc_history": auc_history, "steps": run.max_iter,
            "samples_per_second": run.max_iter * run.batch_size / max(train_seconds, 1e-9), "snapshots": snapshots}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = build_parser().parse_args(argv)
    summary = train(args.dataset_path, model_dir=args.model_dir, export_dir=args.export_dir,
                    log_json=args.log_json, batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
                    max_eval_batches=args.max_eval_batches, max_iter=args.max_iter, display=args.display,
                    eval_interval=args.eval_interval, snapshot=args.snapshot, learning_rate=args.learning_rate,
                    embedding_dim=args.embedding_dim, hidden_units=args.hidden_units, combiner=args.combiner,
                    seed=args.seed, overwrite=args.overwrite)
    print(f"[movielens.train] AUC {summary['final_auc']:.4f} after {summary['steps']} steps")
    return summary


if __name__ == "__main__":
    run_main(main, input_errors=(OutputDirectoryError, FileNotFoundError, ValueError))
