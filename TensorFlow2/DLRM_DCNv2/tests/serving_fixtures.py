"""Tiny DLRM / DCNv2 checkpoints for the serving tests (no training: weights drawn from fixed seeds, then saved with
the recipe's own ``save_checkpoint``, exactly as ``dlrm.py --save_checkpoint_path`` writes them)."""
import os

# DLRM: one-hot tables; DCNv2: tables 1 and 3 multi-hot (hotness 3 and 2), per-table dims.
SHAPES = {
    "dlrm": dict(table_sizes=[40, 25, 10, 7], hotness=[1, 1, 1, 1], embedding_dims=[8, 8, 8, 8],
                 bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 8, 1], interaction="dot", num_numerical_features=5,
                 num_cross_layers=None, cross_layer_projection_dim=None),
    "dcnv2": dict(table_sizes=[40, 25, 10, 7], hotness=[1, 3, 1, 2], embedding_dims=[8, 4, 4, 6],
                  bottom_mlp_dims=[16, 8], top_mlp_dims=[16, 8, 1], interaction="cross", num_numerical_features=5,
                  num_cross_layers=2, cross_layer_projection_dim=4),
}


def model_config(model):
    """``state.json``'s ``config`` as ``dlrm_dcnv2.cli.DlrmDcnv2Config.model_config`` gives it for ``SHAPES[model]``."""
    return dict(SHAPES[model], model=model)


def write_checkpoint(root, model, seed=3, step=7):
    """Build ``SHAPES[model]`` with random weights (``seed``), save it under ``root``; returns the step_<N> path."""
    import tensorflow as tf
    from dlrm_dcnv2.distributed.hvd_utils import Context
    from dlrm_dcnv2.model.model import build_model
    from dlrm_dcnv2.checkpointing import save_checkpoint
    shape = SHAPES[model]
    tf.keras.utils.set_random_seed(seed)
    keras_model = build_model(table_sizes=shape["table_sizes"], embedding_dims=shape["embedding_dims"],
                              bottom_mlp_dims=shape["bottom_mlp_dims"], top_mlp_dims=shape["top_mlp_dims"],
                              interaction="dot_tensorflow" if shape["interaction"] == "dot" else "cross",
                              num_numerical_features=shape["num_numerical_features"], hotness=shape["hotness"],
                              num_cross_layers=shape["num_cross_layers"] or 3,
                              cross_layer_projection_dim=shape["cross_layer_projection_dim"], seed=seed)
    return save_checkpoint(str(root), step, keras_model, None, Context(), model_config(model))


def write_feature_spec(directory, model, rows=64, seed=5, fmt="split_binary"):
    """A dataset of ``rows`` test rows fitting ``SHAPES[model]`` (labels included), in ``fmt`` ("split_binary",
    "csv" or "parquet"); returns its FeatureSpec path. Multi-hot models (dcnv2) get parquet (list columns)."""
    import numpy as np
    from recsys_common.feature_spec import FeatureSpec
    shape = SHAPES[model]
    spec = FeatureSpec.get_default_feature_spec(shape["num_numerical_features"], shape["table_sizes"],
                                                base_directory=str(directory))
    cats = spec.channel_spec["categorical"]
    for name, h in zip(cats, shape["hotness"]):
        if h > 1:
            spec.feature_spec[name]["max_hotness"] = h
    if fmt != "split_binary" or max(shape["hotness"]) > 1:
        fmt = "parquet" if fmt == "split_binary" else fmt
        for name in spec.channel_spec["numerical"]:
            spec.feature_spec[name]["dtype"] = "float32"  # parquet has no float16
        for mapping in list(spec.source_spec):
            features = [f for chunk in spec.source_spec[mapping] for f in chunk["features"]]
            spec.source_spec[mapping] = [{"type": fmt, "features": features,
                                          "files": [f"{mapping}.{'csv' if fmt == 'csv' else 'parquet'}"]}]
    rng = np.random.default_rng(seed)
    columns = {}
    for name in spec.channel_spec["numerical"]:
        columns[name] = rng.normal(size=rows).astype(np.float32)
    for name, card, h in zip(cats, shape["table_sizes"], shape["hotness"]):
        if h == 1:
            columns[name] = rng.integers(0, card, size=rows)
        else:
            ids = rng.integers(0, card, size=(rows, h))
            ids[np.arange(h)[None, :] >= rng.integers(1, h + 1, size=rows)[:, None]] = -1   # padding
            columns[name] = ids
    columns[spec.channel_spec["label"][0]] = rng.integers(0, 2, size=rows)
    from recsys_common.datasets import write_columns
    for mapping in spec.source_spec:
        write_columns(spec, mapping, columns)
    path = os.path.join(str(directory), "feature_spec.yaml")
    spec.to_yaml(path)
    return path
