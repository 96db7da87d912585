"""Training throughput: this recipe's Wide & Deep vs the same model written the plain Keras way, in one run.

    python benchmarks/train_step.py --global_batch_size 4096 --benchmark_warmup_steps 5 --benchmark_steps 10 --rounds 3 \\
        --output_json /tmp/wd_benchmark.json

Both sides train the 29-feature Outbrain Wide & Deep (reference A.2: 13 one-hot and 3 multi-hot categoricals with
the hash-bucket sizes and embedding widths of ``wide_deep/data/outbrain/features.py``, 13 numericals; wide part
FTRL, deep part RMSprop rho 0.5 with ``--deep_hidden_units`` ReLU layers and dropout; sigmoid of the sum) on the SAME
batches, fed by the same in-memory ``tf.data`` pipeline (so the figures compare model and training step, not
input pipelines; the Merlin parquet loader is timed by ``main.py --benchmark``):

    ours    ``wide_deep.model.network.WideDeepModel`` with the training step of ``wide_deep.model.optimizers``
            (gradients in one ``tf.function``, FTRL + RMSprop applied in another; embeddings are gathers whose
            gradients are sparse);
    keras   what a user writes from the Keras docs: ``tf.keras.experimental.WideDeepModel(linear, dnn)`` of two
            functional models, ``Embedding`` layers (width 1 for the linear part, the feature's width for the deep
            part; multi-hot ids shifted by one so that 0 pads, masked and summed), ``compile(optimizer=[Ftrl,
            RMSprop], loss="binary_crossentropy")`` and ``model.fit``.

The batches: ``--dataset_path`` (an Outbrain ETL output; its first ``--num_batches`` batches of train/) or, by
default, ``--num_batches`` synthetic batches drawn per feature (Zipf-skewed ids, 1 to 3 ids per multi-hot row,
normal numericals, 20 % positives), cycled. After ``--benchmark_warmup_steps`` untimed steps per side, ``--rounds``
rounds alternate ours and keras (the order flipped every round), ``--benchmark_steps`` timed steps each. Prints and
writes (``--output_json``) one JSON object: the median samples/s of each side (and each round's), ``speedup`` = the
median over rounds of ours / keras within the round (``speedup_rounds``, and ``speedup_spread``: min, max, quartiles,
IQR / median), the settings, the CPU model and the load average. ``main(argv)`` returns that dict.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from recsys_common.datasets import read_columns
from recsys_common.io import check_json_output, write_json_output
from recsys_common.machine import cpu_bf16_instructions, cpu_model_name as cpu_model
from wide_deep.data.loader import input_description, read_feature_spec
from wide_deep.data.outbrain import features as F
from wide_deep.model.config import ModelConfig
from wide_deep.model.network import WideDeepModel
from wide_deep.model.optimizers import create_optimizers, make_train_step

LABEL = "label"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/train_step.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_flags(p)
    p.add_argument("--benchmark_warmup_steps", type=int, default=10, help="untimed steps first (tracing, caches)")
    p.add_argument("--benchmark_steps", type=int, default=20, help="timed steps per round and side")
    p.add_argument("--rounds", type=int, default=7,
                   help="timed rounds, alternating the two sides (order flipped every round); the figures are the "
                        "medians over rounds, the speedup the median of the rounds' ratios")
    p.add_argument("--output_json", default=None, help="also write the result to this JSON file (atomically)")
    return p


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The batches' and the model's flags (this benchmark's and ``benchmarks/profile_step.py``'s)."""
    p.add_argument("--dataset_path", default=None, help="Outbrain ETL output to take batches from (default: synthetic)")
    p.add_argument("--global_batch_size", type=int, default=4096, help="training batch of both sides")
    p.add_argument("--num_batches", type=int, default=8, help="distinct batches, cycled")
    p.add_argument("--deep_hidden_units", type=int, nargs="+", default=[1024, 1024, 1024, 1024, 1024],
                   help="hidden units of the deep part")
    p.add_argument("--deep_dropout", type=float, default=0.1, help="dropout of the deep part")
    p.add_argument("--linear_learning_rate", type=float, default=0.02, help="FTRL learning rate (wide part)")
    p.add_argument("--deep_learning_rate", type=float, default=0.00012, help="RMSprop learning rate (deep part)")
    p.add_argument("--combiner", choices=["sum", "mean"], default="sum", help="multi-hot pooling")
    p.add_argument("--xla", action="store_true", help="jit_compile the training step on both sides")
    p.add_argument("--amp", action="store_true",
                   help="ours in mixed_bfloat16 (main.py --amp on a CPU; fast where the CPU has AVX512-BF16 or AMX); "
                        "the Keras side stays float32 as a user writes it")
    p.add_argument("--cardinality_scale", type=float, default=1.0,
                   help="multiply every hash-bucket size (tests use a small value to keep the tables tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic batches and of the weights")


# ---------------------------------------------------------------------------------------------------------- inputs
def feature_layout(cardinality_scale: float) -> Dict[str, object]:
    """Onehot/multihot cardinalities, max hotness, numericals and embedding widths of the Outbrain features."""
    scale = lambda c: max(2, int(round(c * cardinality_scale)))   # noqa: E731
    onehot = {f.name: scale(f.cardinality) for f in F.FEATURES if f.kind == "onehot"}
    multihot = {f.name: scale(f.cardinality) for f in F.FEATURES if f.kind == "multihot"}
    return {"onehot": onehot, "multihot": multihot,
            "max_hotness": {f.name: f.max_hotness for f in F.FEATURES if f.kind == "multihot"},
            "numerical": list(F.NUMERICAL_FEATURES),
            "embedding_dims": {f.name: f.embedding_dim for f in F.FEATURES if f.kind != "numerical"}}


def synthetic_batches(layout, batch_size: int, num_batches: int, seed: int) -> Dict[str, np.ndarray]:
    """``num_batches * batch_size`` rows: ids int32 (multi-hot ``[N, H]`` padded with -1), numericals and label float32."""
    rng = np.random.default_rng(seed)
    n = batch_size * num_batches
    data = {}
    for name, card in layout["onehot"].items():
        data[name] = ((rng.zipf(1.2, n) - 1) % card).astype(np.int32)
    for name, card in layout["multihot"].items():
        hot = layout["max_hotness"][name]
        ids = ((rng.zipf(1.2, (n, hot)) - 1) % card).astype(np.int32)
        lengths = rng.integers(1, hot + 1, n)
        ids[np.arange(hot)[None, :] >= lengths[:, None]] = -1
        data[name] = ids
    for name in layout["numerical"]:
        data[name] = rng.standard_normal(n).astype(np.float32)
    data[LABEL] = (rng.random(n) < 0.2).astype(np.float32)
    return data


def dataset_batches(dataset_path: str, batch_size: int, num_batches: int) -> Tuple[Dict[str, np.ndarray], dict]:
    """The first ``num_batches`` batches of an Outbrain ETL output's train/ and the layout from its spec."""
    spec = read_feature_spec(dataset_path, "feature_spec.yaml")
    d = input_description(spec)
    columns = read_columns(spec, "train")
    n = len(columns[d["label"]])
    if n < batch_size:
        raise ValueError(f"{dataset_path}: train has {n} rows, fewer than --global_batch_size {batch_size}")
    rows = min(n // batch_size, num_batches) * batch_size
    data = {k: columns[k][:rows].astype(np.float32 if k in d["numerical"] else np.int32)
            for k in list(d["onehot"]) + list(d["multihot"]) + d["numerical"]}
    data[LABEL] = columns[d["label"]][:rows].astype(np.float32)
    layout = {"onehot": d["onehot"], "multihot": d["multihot"], "max_hotness": d["max_hotness"],
              "numerical": d["numerical"],
              "embedding_dims": {f.name: f.embedding_dim for f in F.FEATURES if f.kind != "numerical"}}
    return data, layout


def load_batches(dataset_path: Optional[str], batch_size: int, num_batches: int, cardinality_scale: float,
                 seed: int) -> Tuple[Dict[str, np.ndarray], Dict[str, object]]:
    """``(batches, feature layout)``: the first batches of an ETL output, or synthetic ones (``--dataset_path``)."""
    if dataset_path:
        return dataset_batches(dataset_path, batch_size, num_batches)
    layout = feature_layout(cardinality_scale)
    return synthetic_batches(layout, batch_size, num_batches, seed), layout


def make_dataset(data: Dict[str, np.ndarray], batch_size: int):
    """``(features, label)`` batches cycled forever (the one input pipeline both sides read)."""
    features = {k: v for k, v in data.items() if k != LABEL}
    return (tf.data.Dataset.from_tensor_slices((features, data[LABEL])).batch(batch_size, drop_remainder=True)
            .cache().repeat().prefetch(tf.data.AUTOTUNE))


# ----------------------------------------------------------------------------------------------------------- sides
def build_ours(layout, hidden_units, dropout, combiner, linear_lr, deep_lr, xla, seed, amp=False):
    """The recipe's model, optimizers and training step (``wide_deep.model.optimizers``'s); returns
    ``step(x, y) -> loss``."""
    config = ModelConfig(onehot=layout["onehot"], multihot=layout["multihot"], max_hotness=layout["max_hotness"],
                         numerical=layout["numerical"], embedding_dims=layout["embedding_dims"],
                         hidden_units=tuple(hidden_units), dropout=dropout, combiner=combiner)
    previous = tf.keras.mixed_precision.global_policy().name
    if amp:   # bfloat16 compute, float32 weights (main.py --amp on a CPU); the Keras side stays float32
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = WideDeepModel(config, seed=seed).build_from_config()
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
    wide_opt, deep_opt = create_optimizers(model, linear_lr, deep_lr, loss_scale=False)
    train_step = make_train_step(model, wide_opt, deep_opt, xla=xla, loss_scale=False)
    deep_lr_tensor = tf.constant(deep_lr, tf.float32)

    def step(features, labels):
        return train_step(features, labels, deep_lr_tensor)
    return model, step


def build_keras(layout, hidden_units, dropout, combiner, linear_lr, deep_lr, xla, seed):
    """The same Wide & Deep as a Keras user writes it (functional models, Embedding layers, WideDeepModel)."""
    L = tf.keras.layers
    tf.keras.utils.set_random_seed(seed)
    inputs = {n: tf.keras.Input(shape=(), dtype=tf.int32, name=n) for n in layout["onehot"]}
    inputs.update({n: tf.keras.Input(shape=(layout["max_hotness"][n],), dtype=tf.int32, name=n)
                   for n in layout["multihot"]})
    inputs.update({n: tf.keras.Input(shape=(), dtype=tf.float32, name=n) for n in layout["numerical"]})
    numericals = L.Concatenate()([L.Reshape((1,))(inputs[n]) for n in layout["numerical"]])

    def pooled(name, card, width):
        if name in layout["onehot"]:
            return L.Embedding(card, width)(inputs[name])
        ids = inputs[name] + 1                       # Keras convention: 0 pads
        emb = L.Embedding(card + 1, width)(ids)
        mask = tf.cast(tf.expand_dims(ids > 0, -1), emb.dtype)
        summed = tf.reduce_sum(emb * mask, axis=1)
        if combiner == "mean":
            summed = summed / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        return summed

    categorical = {**layout["onehot"], **layout["multihot"]}
    wide = [L.Flatten()(pooled(n, c, 1)) for n, c in categorical.items()] + [L.Dense(1, use_bias=True)(numericals)]
    linear = tf.keras.Model(inputs, L.Add()(wide), name="linear")
    x = L.Concatenate()([L.Flatten()(pooled(n, c, layout["embedding_dims"][n])) for n, c in categorical.items()]
                        + [numericals])
    for units in hidden_units:
        x = L.Dropout(dropout)(L.Dense(units, activation="relu")(x))
    dnn = tf.keras.Model(inputs, L.Dense(1)(x), name="dnn")
    model = tf.keras.experimental.WideDeepModel(linear, dnn, activation="sigmoid")
    model.compile(optimizer=[tf.keras.optimizers.Ftrl(linear_lr), tf.keras.optimizers.RMSprop(deep_lr, rho=0.5)],
                  loss="binary_crossentropy", jit_compile=xla)
    return model


def ours_runner(step, dataset):
    """``run(steps) -> seconds`` of ``steps`` training steps (the last loss is fetched before the clock stops)."""
    it = iter(dataset)

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(*next(it))
        float(loss)
        return time.perf_counter() - start
    return run


def keras_runner(model, dataset):
    """``run(steps) -> seconds`` of ``model.fit(dataset, steps_per_epoch=steps)``."""
    def run(steps: int) -> float:
        start = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
        return time.perf_counter() - start
    return run


def run_benchmark(*, dataset_path: Optional[str] = None, global_batch_size: int = 4096, warmup_steps: int = 10,
                  steps: int = 20, num_batches: int = 8, hidden_units: Sequence[int] = (1024,) * 5,
                  dropout: float = 0.1, linear_lr: float = 0.02, deep_lr: float = 0.00012, combiner: str = "sum",
                  xla: bool = False, cardinality_scale: float = 1.0, seed: int = 0, rounds: int = 7,
                  amp: bool = False) -> Dict[str, object]:
    """Time both sides on the same batches; returns the result dict (see the module docstring)."""
    for flag, value in (("--global_batch_size", global_batch_size), ("--benchmark_warmup_steps", warmup_steps),
                        ("--benchmark_steps", steps), ("--num_batches", num_batches), ("--rounds", rounds)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    data, layout = load_batches(dataset_path, global_batch_size, num_batches, cardinality_scale, seed)
    dataset = make_dataset(data, global_batch_size)
    args = (layout, list(hidden_units), dropout, combiner, linear_lr, deep_lr, xla, seed)
    _, ours_step = build_ours(*args, amp=amp)
    runners = {"ours": ours_runner(ours_step, dataset), "keras": keras_runner(build_keras(*args), dataset)}
    for run in runners.values():
        run(warmup_steps)
    seconds = {side: [] for side in runners}
    for r in range(rounds):
        # Interleaved rounds, the order flipped every round (ours-keras, keras-ours, ...): a change of load on a
        # shared machine, or a cost paid by whichever side runs second, hits both sides alike.
        for side in (("ours", "keras") if r % 2 == 0 else ("keras", "ours")):
            seconds[side].append(runners[side](steps))
    rates = {side: [steps * global_batch_size / s for s in secs] for side, secs in seconds.items()}
    ours, keras = float(np.median(rates["ours"])), float(np.median(rates["keras"]))
    # The speedup is the median of each round's ratio: the two sides of a round ran back to back under the same
    # load, so a load change between rounds cancels in the ratio where it would not in a ratio of medians.
    ratios = [o / k for o, k in zip(rates["ours"], rates["keras"])]
    q1, q3 = np.percentile(ratios, [25, 75])
    return {"mode": "train", "ours_samples_per_s": ours, "keras_samples_per_s": keras,
            "speedup": float(np.median(ratios)), "speedup_rounds": ratios,
            "speedup_spread": {"min": float(min(ratios)), "max": float(max(ratios)), "q1": float(q1),
                               "q3": float(q3), "iqr_over_median": float((q3 - q1) / np.median(ratios))},
            "speedup_of_medians": ours / keras,
            "ours_rounds_samples_per_s": rates["ours"], "keras_rounds_samples_per_s": rates["keras"],
            "ours_seconds": float(sum(seconds["ours"])), "keras_seconds": float(sum(seconds["keras"])),
            "rounds": rounds, "global_batch_size": global_batch_size,
            "warmup_steps": warmup_steps, "steps": steps, "num_batches": num_batches,
            "data": dataset_path or "synthetic", "deep_hidden_units": list(hidden_units), "combiner": combiner,
            "xla": xla, "amp": amp, "ours_precision": "mixed_bfloat16" if amp else "float32",
            "keras_precision": "float32", "cpu_bfloat16": cpu_bf16_instructions(),
            "cardinality_scale": cardinality_scale,
            "input": "identical in-memory tf.data batches for both sides",
            "device": "CPU", "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0], "tensorflow": tf.__version__}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = build_parser().parse_args(argv)
    check_json_output(args.output_json)   # refuse a bad path before minutes of work
    result = run_benchmark(dataset_path=args.dataset_path, global_batch_size=args.global_batch_size,
                           warmup_steps=args.benchmark_warmup_steps, steps=args.benchmark_steps,
                           num_batches=args.num_batches, hidden_units=args.deep_hidden_units,
                           dropout=args.deep_dropout, linear_lr=args.linear_learning_rate,
                           deep_lr=args.deep_learning_rate, combiner=args.combiner, xla=args.xla,
                           cardinality_scale=args.cardinality_scale, seed=args.seed, rounds=args.rounds,
                           amp=args.amp)
    print(json.dumps(result), flush=True)
    if args.output_json:
        write_json_output(args.output_json, result)
    return result


if __name__ == "__main__":
    main()
