"""Training and inference samples/s of this recipe's DLRM / DCNv2 against the same model written the plain Keras way.

    python benchmarks/throughput.py                                   # both models, Kaggle + seed shapes
    python benchmarks/throughput.py --models dlrm --shapes kaggle --amp --output_json bench.json

Two sides, on the same data:

* ``ours``: ``model.model.build_model`` (our SparseModel, DenseModel), ``model.optimizers.create_optimizers`` and
  the recipe's ``model.trainer.Trainer`` step (``--xla``: compiled by XLA), a Python loop of ``train_step``; inference is
  the compiled forward pass.
* ``plain_keras``: what a Keras user writes: a functional model with one ``tf.keras.layers.Embedding`` per table,
  ``Dense`` MLPs, TensorFlow Recommenders' ``DotInteraction`` (DLRM) / ``tfrs.layers.dcn.Cross`` (DCNv2) when
  ``tensorflow-recommenders`` imports (else the same layers written the obvious way in plain Keras: the JSON says
  which), ``model.compile(optimizer, BinaryCrossentropy(from_logits=True), jit_compile=--xla)``, ``model.fit`` and
  ``model.predict``; Keras' default optimizers (``SGD`` for DLRM, ``Adam`` for DCNv2) with the same schedule.

Both sides read the same ``--distinct_batches`` synthetic batches (seeded; skewed ids as in Criteo), cycled, from
memory, so the figures are the model's, not a reader's. Each measurement runs in a fresh process (``--in_process``:
in this one) with ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000`` (glibc otherwise returns and
re-faults large gradient buffers every step on these VMs); the sides alternate back to back ``--repeats`` times and
the medians and the median of the per-repeat ratios ours/plain are reported. Steps actually taken are read back
from the optimizers' ``iterations``, and each side reports a fingerprint of the data it trained on.

Shapes: ``kaggle`` = batch 2048, 26 tables x 100k rows, dim 16, bottom 512-256-64-16, top 512-256-1 (the issue's
Kaggle shape); ``seed`` = NVIDIA's defaults (dim 128, bottom 512-256-128, top 1024-1024-512-256-1, DCNv2 3 cross
layers of projection 512) with the tables REDUCED to 26 x 100k rows (Criteo 1TB's reach 40M rows: they do not fit
in this machine's RAM twice over with Adam's slots) and the batch REDUCED from 65536 to ``--seed_batch_size``
(default 16384) so a step takes seconds on 2 CPU cores; ``tiny`` is for tests. Timings on shared machines are
noisy: the JSON records the CPU model and the load average before and after.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from recsys_common.cli import InputError, run_main
from recsys_common.io import check_json_output, report_json
from recsys_common.machine import cpu_bf16_instructions

# TensorFlow and the recipe's model modules (TensorFlow code) are imported inside the functions that build and time
# a model, on purpose: the parent process of the subprocess measurements never starts TensorFlow.

SIDES = ("ours", "plain_keras")
MODELS = ("dlrm", "dcnv2")
NUM_NUMERICAL = 13
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000"}

SHAPES: Dict[str, Dict[str, Any]] = {
    "kaggle": {"batch_size": 2048, "table_sizes": [100_000] * 26, "embedding_dim": 16,
               "bottom_mlp_dims": [512, 256, 64, 16], "top_mlp_dims": [512, 256, 1],
               "num_cross_layers": 3, "cross_layer_projection_dim": 512,
               "note": "the issue's Kaggle shape; DCNv2 uses NVIDIA's default 3 cross layers of projection 512"},
    "seed": {"batch_size": 16384, "table_sizes": [100_000] * 26, "embedding_dim": 128,
             "bottom_mlp_dims": [512, 256, 128], "top_mlp_dims": [1024, 1024, 512, 256, 1],
             "num_cross_layers": 3, "cross_layer_projection_dim": 512,
             "note": "NVIDIA's default model dims; tables reduced to 26 x 100k rows (Criteo 1TB's do not fit in RAM "
                     "here) and batch reduced from 65536 (--seed_batch_size)"},
    "tiny": {"batch_size": 64, "table_sizes": [100, 50, 20, 10], "embedding_dim": 8,
             "bottom_mlp_dims": [16, 8], "top_mlp_dims": [16, 1], "num_cross_layers": 2,
             "cross_layer_projection_dim": 4, "note": "test shape"},
}

# The models' optimizer settings (reference A.3): DLRM SGD lr 24 warmup 8000; DCNv2 Adam lr 1e-4 warmup 100.
OPTIMIZER = {"dlrm": {"optimizer": "sgd", "learning_rate": 24.0, "warmup_steps": 8000},
             "dcnv2": {"optimizer": "adam", "learning_rate": 1e-4, "warmup_steps": 100}}
DECAY_START_STEP, DECAY_STEPS = 48000, 24000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/throughput.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="dlrm,dcnv2", help="comma list of dlrm, dcnv2")
    p.add_argument("--shapes", default="kaggle,seed", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--sides", default="ours,plain_keras", help="comma list of ours, plain_keras")
    p.add_argument("--seed_batch_size", type=int, default=16384, help="batch of the seed shape (NVIDIA: 65536)")
    p.add_argument("--train_steps", type=int, default=30, help="timed training steps per measurement")
    p.add_argument("--warmup_steps", type=int, default=5, help="training steps run before the clock starts")
    p.add_argument("--inference_steps", type=int, default=20, help="timed inference batches per measurement")
    p.add_argument("--distinct_batches", type=int, default=8, help="synthetic batches generated, then cycled")
    p.add_argument("--repeats", type=int, default=3, help="alternating measurements per side (medians reported)")
    p.add_argument("--amp", action="store_true", help="mixed_bfloat16 on both sides")
    p.add_argument("--xla", action="store_true", help="XLA on both sides (our compiled step; compile(jit_compile))")
    p.add_argument("--skip_inference", action="store_true")
    p.add_argument("--in_process", action="store_true", help="measure in this process (tests; default: one "
                                                              "fresh process per measurement)")
    p.add_argument("--data_seed", type=int, default=12345)
    p.add_argument("--output_json", default=None, help="also write the JSON here (atomically)")
    p.add_argument("--_measure", default=None, help=argparse.SUPPRESS)  # internal: one measurement (JSON spec)
    return p


# ------------------------------------------------------------------------------------------------ data
def make_batches(shape: Dict[str, Any], count: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``count`` batches ``{"numerical" [B, 13] f32, "categorical" [T, B] i32, "labels" [B] f32}``.

    Ids are skewed towards low rows (``rows * u^3``), as Criteo's are towards frequent values, so a batch touches
    fewer distinct rows than it has ids; labels follow a fixed logistic rule of the inputs (about 30 % positive).
    """
    rng = np.random.default_rng(seed)
    batch = int(shape["batch_size"])
    sizes = np.asarray(shape["table_sizes"], np.int64)
    weights = rng.normal(size=NUM_NUMERICAL)
    batches = []
    for _ in range(count):
        numerical = np.log1p(rng.exponential(5.0, size=(batch, NUM_NUMERICAL))).astype(np.float32)
        u = rng.random(size=(len(sizes), batch))
        categorical = np.minimum((sizes[:, None] * u ** 3).astype(np.int64), sizes[:, None] - 1).astype(np.int32)
        logit = (numerical - 1.5) @ weights * 0.5 - 0.9 + 0.5 * (categorical[0] % 2)
        labels = (rng.random(batch) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        batches.append({"numerical": numerical, "categorical": categorical, "labels": labels})
    return batches


def fingerprint(batches: Sequence[Dict[str, np.ndarray]], steps: int) -> str:
    """SHA-256 (16 hex) of the batches a side trains on, in order, for ``steps`` steps of the cycle."""
    h = hashlib.sha256()
    for i in range(steps):
        b = batches[i % len(batches)]
        for key in ("numerical", "categorical", "labels"):
            h.update(np.ascontiguousarray(b[key]).tobytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ the two sides
def _schedule(model: str):
    from dlrm_dcnv2.model.lr_scheduler import WarmupPolyDecay
    o = OPTIMIZER[model]
    return WarmupPolyDecay(o["learning_rate"], o["warmup_steps"], DECAY_START_STEP, DECAY_STEPS)


def build_ours(model_name: str, shape: Dict[str, Any], batches, xla: bool,
               compile_embedding_update: Optional[bool] = None):
    """The recipe's model, optimizers and trainer for ``model_name`` at ``shape`` (under the current precision
    policy), and ``batches`` as tensors: ``(model, trainer, embedding_optimizer, data)``; ``data[i]`` is
    ``(numerical, categorical tuple, labels)`` for ``trainer.train_step``. Also what ``profile_step`` profiles."""
    import tensorflow as tf
    from dlrm_dcnv2.distributed import hvd_utils
    from dlrm_dcnv2.model.model import build_model
    from dlrm_dcnv2.model.optimizers import create_optimizers
    from dlrm_dcnv2.model.trainer import Trainer

    ctx = hvd_utils.Context()
    model = build_model(table_sizes=shape["table_sizes"], embedding_dims=shape["embedding_dim"],
                        bottom_mlp_dims=shape["bottom_mlp_dims"], top_mlp_dims=shape["top_mlp_dims"],
                        interaction="dot_tensorflow" if model_name == "dlrm" else "cross",
                        num_numerical_features=NUM_NUMERICAL, num_cross_layers=shape["num_cross_layers"],
                        cross_layer_projection_dim=shape["cross_layer_projection_dim"], ctx=ctx, seed=1, xla=xla)
    dense_opt, emb_opt = create_optimizers(OPTIMIZER[model_name]["optimizer"], _schedule(model_name))
    trainer = Trainer(model, dense_opt, emb_opt, ctx=ctx, loss_scale=None, xla=xla,
                      compile_embedding_update=compile_embedding_update)
    data = [(tf.constant(b["numerical"]), tuple(tf.constant(c) for c in b["categorical"]),
             tf.constant(b["labels"])) for b in batches]
    return model, trainer, emb_opt, data


def _measure_ours(model_name: str, shape: Dict[str, Any], batches, spec: Dict[str, Any]) -> Dict[str, Any]:
    from dlrm_dcnv2.distributed import hvd_utils

    model, trainer, emb_opt, data = build_ours(model_name, shape, batches, spec["xla"])

    def train(first: int, count: int):
        loss = None
        for i in range(first, first + count):
            numerical, categorical, labels = data[i % len(data)]
            loss = trainer.train_step(numerical, categorical, labels)
        return float(loss.numpy())  # the host waits for the last step

    train(0, spec["warmup_steps"])
    start_iterations = int(emb_opt.iterations.numpy())
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = train(spec["warmup_steps"], spec["train_steps"])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    result = _train_record(int(emb_opt.iterations.numpy()) - start_iterations, shape, seconds, loss, cpu_seconds)
    if not spec["skip_inference"]:
        predict = hvd_utils.compile_step(lambda n, c: model((n, c), training=False), spec["xla"])
        predict(data[0][0], data[0][1]).numpy()  # trace / compile
        start = time.perf_counter()
        for i in range(spec["inference_steps"]):
            numerical, categorical, _ = data[i % len(data)]
            predict(numerical, categorical).numpy()
        result.update(_inference_record(spec["inference_steps"], shape, time.perf_counter() - start))
    return result


def _plain_interaction_layers():
    """TFRS' DotInteraction and Cross when tensorflow-recommenders imports, else plain-Keras versions; + a label."""
    try:
        import tensorflow_recommenders as tfrs
        return (tfrs.layers.feature_interaction.DotInteraction, tfrs.layers.dcn.Cross,
                f"tensorflow_recommenders {getattr(tfrs, '__version__', '?')}: "
                f"tfrs.layers.feature_interaction.DotInteraction / tfrs.layers.dcn.Cross")
    except Exception:  # noqa: BLE001  (absent or broken: both mean "use the plain fallback", said in the JSON)
        pass
    import tensorflow as tf

    class PlainDotInteraction(tf.keras.layers.Layer):
        """What a user writes: stack, Gram matrix, keep i < j with a boolean mask."""

        def call(self, inputs):
            x = tf.stack(inputs, axis=1)
            gram = tf.matmul(x, x, transpose_b=True)
            n = len(inputs)
            mask = np.triu(np.ones((n, n), bool), k=1)
            return tf.reshape(tf.boolean_mask(gram, mask, axis=1), [-1, int(mask.sum())])

    class PlainCross(tf.keras.layers.Layer):
        """x0 * (U(V x) + b) + x with two Dense layers."""

        def __init__(self, projection_dim=None, **kwargs):
            super().__init__(**kwargs)
            self.projection_dim = projection_dim

        def build(self, input_shape):
            self.v = tf.keras.layers.Dense(self.projection_dim, use_bias=False)
            self.u = tf.keras.layers.Dense(int(input_shape[-1]))

        def call(self, x0, x):
            return x0 * self.u(self.v(x)) + x

    return (PlainDotInteraction, PlainCross,
            "tensorflow-recommenders not importable: plain Keras DotInteraction/Cross written the obvious way")


def build_plain_keras_model(model_name: str, shape: Dict[str, Any]):
    """The functional Keras model a user would write for ``model_name`` at ``shape``; returns (model, label)."""
    import tensorflow as tf
    dot_cls, cross_cls, label = _plain_interaction_layers()
    numerical = tf.keras.Input((NUM_NUMERICAL,), name="numerical")
    ids = [tf.keras.Input((), dtype=tf.int32, name=f"cat_{t}") for t in range(len(shape["table_sizes"]))]
    embeddings = [tf.keras.layers.Embedding(rows, shape["embedding_dim"], name=f"embedding_{t}")(i)
                  for t, (rows, i) in enumerate(zip(shape["table_sizes"], ids))]
    x = numerical
    for units in shape["bottom_mlp_dims"]:
        x = tf.keras.layers.Dense(units, activation="relu")(x)
    if model_name == "dlrm":
        z = tf.keras.layers.Concatenate()([x, dot_cls()([x] + embeddings)])
    else:
        x0 = tf.keras.layers.Concatenate()([x] + embeddings)
        z = x0
        for _ in range(shape["num_cross_layers"]):
            z = cross_cls(projection_dim=shape["cross_layer_projection_dim"])(x0, z)
    for units in shape["top_mlp_dims"][:-1]:
        z = tf.keras.layers.Dense(units, activation="relu")(z)
    logits = tf.keras.layers.Dense(shape["top_mlp_dims"][-1], dtype="float32")(z)
    return tf.keras.Model([numerical] + ids, logits), label


def _measure_plain(model_name: str, shape: Dict[str, Any], batches, spec: Dict[str, Any]) -> Dict[str, Any]:
    import tensorflow as tf
    model, label = build_plain_keras_model(model_name, shape)
    optimizer = (tf.keras.optimizers.SGD(_schedule(model_name)) if OPTIMIZER[model_name]["optimizer"] == "sgd"
                 else tf.keras.optimizers.Adam(_schedule(model_name)))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                  jit_compile=bool(spec["xla"]))
    inputs = ((np.stack([b["numerical"] for b in batches]),) +
              tuple(np.stack([b["categorical"][t] for b in batches]) for t in range(len(shape["table_sizes"]))))
    labels = np.stack([b["labels"] for b in batches])[..., None]
    # One element = one whole batch, in the same order as ours, cycled.
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).repeat()

    def fit(skip: int, steps: int) -> float:
        history = model.fit(dataset.skip(skip % len(batches)), steps_per_epoch=steps, epochs=1, verbose=0)
        return float(history.history["loss"][-1])

    fit(0, spec["warmup_steps"])
    start_iterations = int(model.optimizer.iterations.numpy())
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = fit(spec["warmup_steps"], spec["train_steps"])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    result = _train_record(int(model.optimizer.iterations.numpy()) - start_iterations, shape, seconds, loss,
                           cpu_seconds)
    result["plain_keras_layers"] = label
    result["plain_keras_optimizer"] = type(optimizer).__module__ + "." + type(optimizer).__name__
    if not spec["skip_inference"]:
        features = dataset.map(lambda x, y: (x,))  # a 1-tuple: Keras would read a bare tuple as (x, y, ...)
        model.predict(features, steps=2, verbose=0)  # trace
        start = time.perf_counter()
        model.predict(features, steps=spec["inference_steps"], verbose=0)
        result.update(_inference_record(spec["inference_steps"], shape, time.perf_counter() - start))
    return result


def _train_record(steps: int, shape, seconds: float, loss: float, cpu_seconds: float) -> Dict[str, Any]:
    """``train_cpu_ms_per_step``: CPU time of this process (all its threads) per step, which moves less than the
    wall clock when other jobs share the cores (the wall clock also counts the time the step waited for a core)."""
    samples = steps * int(shape["batch_size"])
    return {"train_steps": steps, "train_samples": samples, "train_seconds": seconds,
            "train_samples_per_s": samples / seconds, "train_cpu_ms_per_step": 1000 * cpu_seconds / max(steps, 1),
            "final_train_loss": loss}


def _inference_record(steps: int, shape, seconds: float) -> Dict[str, Any]:
    samples = steps * int(shape["batch_size"])
    return {"inference_steps": steps, "inference_samples": samples, "inference_seconds": seconds,
            "inference_samples_per_s": samples / seconds}


def measure(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One measurement: ``spec`` = {side, model, shape (dict), warmup_steps, train_steps, inference_steps,
    distinct_batches, data_seed, amp, xla, skip_inference} -> record (samples/s, steps taken, data fingerprint)."""
    import tensorflow as tf
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if spec["amp"] else "float32")
    try:
        shape = spec["shape"]
        batches = make_batches(shape, spec["distinct_batches"], spec["data_seed"])
        run = _measure_ours if spec["side"] == "ours" else _measure_plain
        record = run(spec["model"], shape, batches, spec)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    record["data_fingerprint"] = fingerprint(batches, spec["warmup_steps"] + spec["train_steps"])
    record.update(side=spec["side"], model=spec["model"])
    return record


def _measure_in_subprocess(spec: Dict[str, Any]) -> Dict[str, Any]:
    recipe = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    common = os.path.join(os.path.dirname(os.path.dirname(recipe)), "common")
    env = dict(os.environ, **MALLOC_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [recipe, common, env.get("PYTHONPATH", "")] if p)
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_measure", json.dumps(spec)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark measurement {spec['side']}/{spec['model']} failed "
                           f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ reporting
def machine_info() -> Dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu_model": model, "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "cpu_bf16_instructions": cpu_bf16_instructions()}  # what --amp's bf16 GEMMs ran on


def _parse_list(text: str, allowed: Sequence[str], flag: str) -> List[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise InputError(f"{flag}: expected a comma list of {', '.join(allowed)}, got {text!r}")
    return items


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if args._measure:
        print(json.dumps(measure(json.loads(args._measure))), flush=True)
        return {}
    check_json_output(args.output_json)  # before minutes of runs, not after
    models = _parse_list(args.models, MODELS, "--models")
    shapes = _parse_list(args.shapes, tuple(SHAPES), "--shapes")
    sides = _parse_list(args.sides, SIDES, "--sides")
    for flag in ("train_steps", "inference_steps", "distinct_batches", "repeats"):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    measure_fn = measure if args.in_process else _measure_in_subprocess
    result: Dict[str, Any] = {
        "machine": machine_info(), "loadavg_start": list(os.getloadavg()),
        "config": {k: v for k, v in vars(args).items() if k not in ("output_json", "_measure")},
        "environment": ({} if args.in_process else dict(MALLOC_ENV)),
        "precision": "mixed_bfloat16" if args.amp else "float32", "results": []}
    for shape_name in shapes:
        shape = dict(SHAPES[shape_name])
        if shape_name == "seed":
            shape["batch_size"] = args.seed_batch_size
        for model_name in models:
            runs: Dict[str, List[Dict[str, Any]]] = {side: [] for side in sides}
            for repeat in range(args.repeats):
                for side in sides:  # back to back: both sides see the same machine load
                    spec = {"side": side, "model": model_name, "shape": shape, "warmup_steps": args.warmup_steps,
                            "train_steps": args.train_steps, "inference_steps": args.inference_steps,
                            "distinct_batches": args.distinct_batches, "data_seed": args.data_seed,
                            "amp": args.amp, "xla": args.xla, "skip_inference": args.skip_inference}
                    record = measure_fn(spec)
                    record["repeat"] = repeat
                    runs[side].append(record)
                    print(json.dumps({k: v for k, v in record.items()}), file=sys.stderr, flush=True)
            entry: Dict[str, Any] = {"model": model_name, "shape": shape_name,
                                     "shape_config": {k: v for k, v in shape.items() if k != "table_sizes"},
                                     "table_sizes": _describe_tables(shape["table_sizes"]), "runs": runs,
                                     "median": {side: _medians(rs) for side, rs in runs.items()}}
            if "ours" in runs and "plain_keras" in runs:
                entry["ratio_ours_over_plain"] = {
                    key: statistics.median(a[key] / b[key] for a, b in zip(runs["ours"], runs["plain_keras"]))
                    for key in ("train_samples_per_s", "inference_samples_per_s") if key in runs["ours"][0]}
                # CPU time per step, plain over ours: the speed-up by work, steadier than samples/s on shared cores.
                entry["train_cpu_ratio_plain_over_ours"] = statistics.median(
                    b["train_cpu_ms_per_step"] / a["train_cpu_ms_per_step"]
                    for a, b in zip(runs["ours"], runs["plain_keras"]))
                entry["plain_keras_layers"] = runs["plain_keras"][0].get("plain_keras_layers")
                print(f"{model_name} {shape_name}: ours/plain training x{entry['ratio_ours_over_plain']['train_samples_per_s']:.2f}"
                      + (f", inference x{entry['ratio_ours_over_plain']['inference_samples_per_s']:.2f}"
                         if "inference_samples_per_s" in entry["ratio_ours_over_plain"] else ""),
                      file=sys.stderr, flush=True)
            result["results"].append(entry)
    result["loadavg_end"] = list(os.getloadavg())
    return report_json(result, args.output_json)


def _describe_tables(sizes: Sequence[int]) -> str:
    sizes = list(sizes)
    return f"{len(sizes)} x {sizes[0]}" if len(set(sizes)) == 1 else ",".join(str(s) for s in sizes)


def _medians(records: List[Dict[str, Any]]) -> Dict[str, float]:
    keys = [k for k, v in records[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k != "repeat"]
    return {k: statistics.median(r[k] for r in records) for k in keys}


if __name__ == "__main__":
    run_main(main, input_errors=(FileExistsError,))   # InputError: a bad flag; FileExistsError: --output_json
