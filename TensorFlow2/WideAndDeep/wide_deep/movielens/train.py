"""Train the MovieLens CTR model of the HugeCTR notebook with this recipe's model code, evaluate AUC, export it.

    python -m wide_deep.movielens.etl   --input_dir /data/ml-100k --output_dir /data/movielens
    python -m wide_deep.movielens.train --dataset_path /data/movielens --model_dir /tmp/ml_snapshots \\
        --export_dir /tmp/ml_export --max_iter 2000 --display 100 --eval_interval 200 --snapshot 1900

The model is the deep part of the recipe's Wide & Deep (:class:`wide_deep.trainer.model.DeepPart`), configured as
the notebook's network: an embedding of width ``--embedding_dim`` (16) per categorical (``userId``, ``movieId``
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
from typing import Dict, List, Optional, Sequence

import numpy as np

from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError, atomic_directory, check_output_directory
from recsys_common.logger import Logger
from recsys_common.metrics import roc_auc_score

from .etl import GENRES, ITEM, LABEL, LABEL_CHANNEL, MULTIHOT_CHANNEL, ONEHOT_CHANNEL, SPEC_NAME, USER

TOOL = "wide_deep.movielens.train"
GRAPH_JSON = "movielens.json"
SAVEDMODEL_DIR = "model.savedmodel"
SNAPSHOT_META = "meta.json"
# The snapshots' format lives with the recipe's other checkpoint format (wide_deep/checkpointing.py).
from ..checkpointing import restore_snapshot, write_snapshot  # noqa: E402,F401


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


# ------------------------------------------------------------------------------------------------------------ data
def part_files(spec: FeatureSpec, mapping: str) -> List[str]:
    """The parquet parts of one split (``wide_deep.movielens.etl`` writes one per ``--part_rows`` ratings)."""
    files = []
    for chunk in spec.source_spec.get(mapping, []):
        if chunk.get("type") != "parquet":
            raise ValueError(f"{spec.origin}: mapping {mapping!r} has a {chunk.get('type')!r} chunk; "
                             f"wide_deep.movielens.etl writes parquet")
        files += [os.path.join(spec.base_directory, name) for name in chunk["files"]]
    if not files:
        raise ValueError(f"{spec.origin}: mapping {mapping!r} lists no files")
    return files


def load_part(spec: FeatureSpec, path: str) -> Dict[str, np.ndarray]:
    """One parquet part as the model's inputs: ids int32, a multi-hot as ``[N, max_hotness]`` int32 padded with -1
    (built from the list column's lengths and values: no Python object per row), the label float32."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    names = model_feature_names(spec)
    table = pq.read_table(path, columns=names + [LABEL])
    rows = table.num_rows
    data = {}
    for name in names:
        column = table.column(name).combine_chunks()
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            data[name] = column.to_numpy().astype(np.int32)
            continue
        width = spec.max_hotness(name)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy().astype(np.int64)
        if lengths.size and lengths.max() > width:
            row = int(np.argmax(lengths > width))
            raise ValueError(f"{path}: row {row}: {name} holds {int(lengths[row])} values, more than the spec's "
                             f"max_hotness {width}")
        values = column.flatten().to_numpy().astype(np.int32)
        padded = np.full((rows, width), -1, dtype=np.int32)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded[np.repeat(np.arange(rows), lengths), np.arange(len(values)) - starts] = values
        data[name] = padded
    data[LABEL] = table.column(LABEL).to_numpy().astype(np.float32)
    return data


def load_split(spec: FeatureSpec, mapping: str) -> Dict[str, np.ndarray]:
    """One split in memory as the model's inputs (every part): ids int32 (genres ``[N, max_hotness]``, -1 padded),
    label float32. Training and evaluation stream the parts instead (:func:`training_batches`,
    :func:`evaluate_auc_parts`)."""
    parts = [load_part(spec, path) for path in part_files(spec, mapping)]
    data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if len(data[LABEL]) == 0:
        raise ValueError(f"{spec.origin}: mapping {mapping!r} has no rows")
    return data


def split_rows(spec: FeatureSpec, mapping: str) -> int:
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(path).metadata.num_rows for path in part_files(spec, mapping))


def training_batches(spec: FeatureSpec, batch_size: int, seed: int):
    """Endless shuffled training batches, a part at a time (HugeCTR's non-epoch mode): every pass visits the parts in
    a new random order and each part's rows in a new random order; rows left over at the end of a part open the next
    batch. Memory: about two parts, whatever the number of ratings. A split of one part is read once."""
    files = part_files(spec, "train")
    rng = np.random.default_rng(seed)
    cached = load_part(spec, files[0]) if len(files) == 1 else None
    carry: Optional[Dict[str, np.ndarray]] = None
    while True:
        for index in rng.permutation(len(files)):
            part = cached if cached is not None else load_part(spec, files[index])
            order = rng.permutation(len(part[LABEL]))
            part = {k: v[order] for k, v in part.items()}
            if carry is not None:
                part = {k: np.concatenate([carry[k], v]) for k, v in part.items()}
            full = len(part[LABEL]) // batch_size * batch_size
            for lo in range(0, full, batch_size):
                yield {k: v[lo:lo + batch_size] for k, v in part.items()}
            carry = {k: v[full:] for k, v in part.items()}


def model_feature_names(spec: FeatureSpec) -> List[str]:
    return list(spec.channel_spec[ONEHOT_CHANNEL]) + list(spec.channel_spec.get(MULTIHOT_CHANNEL, []))


def model_config(spec: FeatureSpec, embedding_dim: int, hidden_units: Sequence[int], combiner: str):
    """The recipe's ``ModelConfig`` for the notebook's network (no numericals, no dropout)."""
    from wide_deep.trainer.model import ModelConfig
    onehot = {n: spec.cardinality(n) for n in spec.channel_spec[ONEHOT_CHANNEL]}
    multihot = {n: spec.cardinality(n) for n in spec.channel_spec.get(MULTIHOT_CHANNEL, [])}
    return ModelConfig(onehot=onehot, multihot=multihot, max_hotness={n: spec.max_hotness(n) for n in multihot},
                       numerical=[], embedding_dims={n: embedding_dim for n in {**onehot, **multihot}},
                       hidden_units=tuple(hidden_units), dropout=0.0, combiner=combiner)


# ----------------------------------------------------------------------------------------------------------- model
def build_model(config, seed: int):
    """The deep-only configuration of the recipe's model: ``DeepPart`` alone, as a Keras model with its variables built.

    ``model(inputs)`` -> logits ``[B]``; ``model.deep`` is the recipe's ``DeepPart``.
    """
    import tensorflow as tf
    from wide_deep.trainer.model import DeepPart

    class DeepOnlyModel(tf.keras.Model):
        def __init__(self):
            super().__init__(name="movielens_deep")
            self.deep = DeepPart(config, seed=seed, name="deep")

        def call(self, inputs, training=False):
            return self.deep(inputs, training=training)

    model = DeepOnlyModel()
    dummy = {n: tf.zeros([2], tf.int32) for n in config.onehot}
    dummy.update({n: -tf.ones([2, config.max_hotness[n]], tf.int32) for n in config.multihot})
    model(dummy)
    return model


def predict(model, data: Dict[str, np.ndarray], names: Sequence[str], batch_size: int,
            max_batches: int = 0) -> np.ndarray:
    """Logits for the rows of ``data`` (the first ``max_batches`` batches if > 0), as float64."""
    import tensorflow as tf
    n = len(data[LABEL]) if not max_batches else min(len(data[LABEL]), max_batches * batch_size)
    step = _predict_fn(model)
    out = [step({k: tf.constant(data[k][i:i + batch_size]) for k in names}).numpy()
           for i in range(0, n, batch_size)]
    return np.concatenate(out).astype(np.float64)


def _predict_fn(model):
    import tensorflow as tf
    if not hasattr(model, "_movielens_predict"):
        model._movielens_predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    return model._movielens_predict


def evaluate_auc(model, data, names, batch_size: int, max_batches: int = 0) -> float:
    logits = predict(model, data, names, batch_size, max_batches)
    return float(roc_auc_score(data[LABEL][:len(logits)], logits))


def evaluate_auc_parts(model, spec: FeatureSpec, names, batch_size: int, max_batches: int = 0) -> float:
    """Exact AUC over the ``test`` split (or its first ``max_batches`` batches), predicted a part at a time: only the
    logits and labels (12 bytes a row) are kept, not the inputs."""
    logits, labels, budget = [], [], max_batches * batch_size if max_batches else None
    for path in part_files(spec, "test"):
        part = load_part(spec, path)
        if budget is not None:
            part = {k: v[:budget - sum(len(l) for l in labels)] for k, v in part.items()}
        logits.append(predict(model, part, names, batch_size))
        labels.append(part[LABEL])
        if budget is not None and sum(len(l) for l in labels) >= budget:
            break
    return float(roc_auc_score(np.concatenate(labels), np.concatenate(logits)))


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
    import tensorflow as tf
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
    import tensorflow as tf
    spec = FeatureSpec.from_yaml(os.path.join(dataset_path, SPEC_NAME), check_files=True)
    for channel in (LABEL_CHANNEL, ONEHOT_CHANNEL):
        if not spec.channel_spec.get(channel):
            raise ValueError(f"{spec.origin}: channel {channel!r} is empty; is this a wide_deep.movielens.etl output?")
    names = model_feature_names(spec)
    rows_train, rows_valid = split_rows(spec, "train"), split_rows(spec, "test")
    if not rows_train or not rows_valid:
        raise ValueError(f"{spec.origin}: {'train' if not rows_train else 'test'} has no rows")
    tf.keras.utils.set_random_seed(seed)
    config = model_config(spec, embedding_dim, hidden_units, combiner)
    model = build_model(config, seed)
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    # Non-epoch mode, as HugeCTR's repeat_dataset=True: the shuffled training set repeats until max_iter, read a
    # part at a time (memory does not grow with the number of ratings).
    signature = {n: tf.TensorSpec([batch_size] + ([spec.max_hotness(n)] if n in spec.channel_spec.get(
        MULTIHOT_CHANNEL, []) else []), tf.int32) for n in names}
    signature[LABEL] = tf.TensorSpec([batch_size], tf.float32)
    ds = tf.data.Dataset.from_generator(lambda: training_batches(spec, batch_size, seed),
                                        output_signature=signature).prefetch(2)
    solver = {"batchsize": batch_size, "batchsize_eval": eval_batch_size, "max_iter": max_iter, "display": display,
              "eval_interval": eval_interval, "snapshot": snapshot, "max_eval_batches": max_eval_batches,
              "seed": seed}
    opt_json = {"type": "Adam", "learning_rate": learning_rate, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}
    log = Logger(log_json, stdout=stdout)
    log.log_parameters({"dataset_path": dataset_path, **solver, "optimizer": opt_json, "embedding_dim": embedding_dim,
                        "hidden_units": list(hidden_units), "combiner": combiner,
                        "rows_train": rows_train, "rows_valid": rows_valid,
                        "total_params": int(model.count_params())})
    auc_history: List[Dict[str, float]] = []
    losses, train_seconds, window_start = [], 0.0, time.perf_counter()
    snapshots = []
    for step, batch in enumerate(ds.take(max_iter), start=1):
        y = batch.pop(LABEL)
        losses.append(train_step(batch, y))
        if step % display == 0 or step == max_iter:
            mean_loss = float(np.mean([float(l) for l in losses]))   # fetch only here: no sync every step
            seconds = time.perf_counter() - window_start
            train_seconds += seconds
            log.log(step=(step,), data={"loss": mean_loss, "iters": len(losses), "seconds": seconds,
                                        "samples_per_second": len(losses) * batch_size / seconds})
            losses, window_start = [], time.perf_counter()
        if step % eval_interval == 0 or step == max_iter:
            t = time.perf_counter()
            auc = evaluate_auc_parts(model, spec, names, eval_batch_size, max_eval_batches)
            auc_history.append({"step": step, "auc": auc})
            log.log(step=(step,), data={"eval_auc": auc, "eval_seconds": time.perf_counter() - t})
            window_start += time.perf_counter() - t   # evaluation time is not training time
        if model_dir and step % snapshot == 0:
            t = time.perf_counter()
            snapshots.append(write_snapshot(model_dir, step, model, optimizer))
            log.log(step=(step,), data={"snapshot": snapshots[-1]})
            window_start += time.perf_counter() - t
    summary = {"final_auc": auc_history[-1]["auc"], "auc_history": auc_history, "steps": max_iter,
               "samples_per_second": max_iter * batch_size / max(train_seconds, 1e-9), "snapshots": snapshots}
    graph = graph_json(model, spec, solver, opt_json)
    if export_dir:
        summary["export"] = export_model(export_dir, model, graph, overwrite=overwrite)
    log.log_summary({k: v for k, v in summary.items() if k != "auc_history"})
    log.close()
    summary["model"], summary["graph"] = model, graph
    return summary


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
    from recsys_common.cli import run_main
    run_main(main, input_errors=(OutputDirectoryError, FileNotFoundError, ValueError))
