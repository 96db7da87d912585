"""The command line against NVIDIA's TF2 recipe (reference A.3): every flag, its default per model, absl spellings."""
import json

import pytest

from dlrm_dcnv2.cli import UsageError, build_parser, parameter_table, parse_args, parse_embedding_dims

# Reference A.3, "Common flags" (main.py define_common_flags); values as the parser stores them.
COMMON_DEFAULTS = {
    "mode": "train", "run_eagerly": False, "tfdata_debug": False, "seed": None,
    "embedding_zeros_initializer": False, "embedding_trainable": True, "amp": False, "use_mde_embeddings": True,
    "concat_embedding": False, "dist_strategy": "memory_balanced", "column_slice_threshold": 5e9,
    "row_slice_threshold": 1e10, "data_parallel_threshold": None, "cpu_offloading_threshold_gb": 75,
    "cpu": False, "xla": False, "loss_scale": 65536, "inter_op_parallelism": None, "intra_op_parallelism": None,
    "save_checkpoint_path": None, "restore_checkpoint_path": None, "auc_thresholds": 8000, "epochs": 1,
    "max_steps": -1, "evals_per_epoch": 1, "print_freq": 100, "profiler_start_step": None, "profiled_rank": 1,
    "log_path": "dlrm_tf_log.json", "dataset_path": None, "feature_spec": "feature_spec.yaml",
    "dataset_type": "tf_raw", "data_parallel_input": False, "synthetic_dataset_use_feature_spec": False,
    "synthetic_dataset_train_batches": 64008, "synthetic_dataset_valid_batches": 1350,
    "synthetic_dataset_cardinalities": [1000] * 26, "synthetic_dataset_hotness": [20] * 26,
    "synthetic_dataset_num_numerical_features": 13,
    # model flags with the same default in dlrm.py and dcnv2.py
    "batch_size": 65536, "valid_batch_size": 65536, "top_mlp_dims": [1024, 1024, 512, 256, 1],
    "bottom_mlp_dims": [512, 256, 128], "embedding_dim": "128", "beta1": 0.9, "beta2": 0.999,
    "decay_start_step": 48000, "decay_steps": 24000, "num_cross_layers": 3, "cross_layer_projection_dim": 512,
}
MODEL_DEFAULTS = {
    "dlrm": {"optimizer": "sgd", "interaction": "dot_custom_cuda", "learning_rate": 24, "warmup_steps": 8000},
    "dcnv2": {"optimizer": "adam", "interaction": "cross", "learning_rate": 0.0001, "warmup_steps": 100},
}
OURS = {"checkpoint_every_steps": None, "checkpoint_every_minutes": None, "keep_checkpoints": 2, "overwrite": False,
        "inference_batch_sizes": None, "inference_steps": 100, "inference_warmup_steps": 10, "reliability_plot": None}


@pytest.mark.parametrize("model", ["dlrm", "dcnv2"])
def test_defaults_match_the_reference(model):
    parsed = vars(build_parser(model).parse_args([]))
    expected = {**COMMON_DEFAULTS, **MODEL_DEFAULTS[model], **OURS}
    assert {k: parsed[k] for k in expected} == expected
    assert set(parsed) == set(expected), "a flag without a reference/our default in this test"


def test_choices_are_nvidias():
    actions = {a.dest: a for a in build_parser("dlrm")._actions}
    assert actions["mode"].choices == ("train", "eval", "inference")
    assert actions["interaction"].choices == ("dot_custom_cuda", "dot_tensorflow", "cross")
    assert actions["dataset_type"].choices == ("tf_raw", "synthetic", "split_tfrecords")
    assert actions["optimizer"].choices == ("sgd", "adam")
    assert set(actions["dist_strategy"].choices) == {"memory_balanced", "basic", "memory_optimized"}


@pytest.mark.parametrize("argv, expected", [
    (["--amp"], True), (["--amp=true"], True), (["--amp", "false"], False), (["--noamp"], False),
    (["--amp", "--noamp"], False), (["--noamp", "--amp"], True), (["--amp=0"], False),
])
def test_absl_boolean_spellings(argv, expected):
    assert build_parser("dlrm").parse_args(argv).amp is expected


def test_negated_defaults_true():
    args = build_parser("dcnv2").parse_args(["--nouse_mde_embeddings", "--noembedding_trainable", "--xla", "--cpu"])
    assert (args.use_mde_embeddings, args.embedding_trainable, args.xla, args.cpu) == (False, False, True, True)


def test_bad_boolean_is_rejected(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser("dlrm").parse_args(["--amp=maybe"])
    assert exc.value.code == 2 and "--amp" in capsys.readouterr().err


def test_embedding_dim_forms(tmp_path):
    assert parse_embedding_dims("16", 3) == [16, 16, 16]
    assert parse_embedding_dims("8,16,32", 3) == [8, 16, 32]
    path = tmp_path / "dims.json"
    path.write_text(json.dumps([4, 8]))
    assert parse_embedding_dims(str(path), 2) == [4, 8]
    with pytest.raises(UsageError, match="--embedding_dim .*2 dims for 3 categorical"):
        parse_embedding_dims("8,16", 3)
    with pytest.raises(UsageError, match="--embedding_dim .*no such file"):
        parse_embedding_dims(str(tmp_path / "missing.json"), 2)
    (tmp_path / "bad.json").write_text("{\"a\": 1}")
    with pytest.raises(UsageError, match="bad.json: expected a JSON integer or list"):
        parse_embedding_dims(str(tmp_path / "bad.json"), 2)


@pytest.mark.parametrize("argv, match", [
    (["--dataset_type", "synthetic", "--top_mlp_dims", "64,2"], "--top_mlp_dims 64,2: the last layer"),
    (["--dataset_type", "synthetic", "--max_steps", "0"], "--max_steps"),
    (["--dataset_type", "synthetic", "--batch_size", "0"], "--batch_size must be at least 1"),
    (["--dataset_type", "synthetic", "--learning_rate", "nan"], "--learning_rate"),
    ([], "--dataset_type tf_raw needs --dataset_path"),
    (["--dataset_type", "synthetic", "--checkpoint_every_steps", "5"], "need --save_checkpoint_path"),
    (["--dataset_type", "synthetic", "--tfdata_debug"], "--tfdata_debug is NVIDIA's and not implemented .*tf.data"),
    (["--dataset_type", "synthetic", "--data_parallel_input=true"], "--data_parallel_input is NVIDIA's"),
    (["--dataset_type", "synthetic", "--concat_embedding"], "--concat_embedding is NVIDIA's .* per table"),
])
def test_impossible_flags_name_the_flag(argv, match):
    with pytest.raises(UsageError, match=match):
        parse_args(argv, "dlrm")


def test_mde_embeddings_with_checkpoints_are_refused_before_training(monkeypatch, tmp_path):
    """Where Merlin Distributed Embeddings is installed (so --use_mde_embeddings, the default, uses it), saving or
    restoring the recipe's checkpoints cannot work: refused when the flags are read, not after training."""
    from dlrm_dcnv2.model import sparse_model
    base = ["--dataset_type", "synthetic"]
    for flag in ("--save_checkpoint_path", "--restore_checkpoint_path"):
        assert parse_args(base + [flag, str(tmp_path)], "dlrm")  # MDE absent here: our placement, checkpoints fine
    monkeypatch.setattr(sparse_model, "mde_available", lambda: True)
    for flag in ("--save_checkpoint_path", "--restore_checkpoint_path"):
        with pytest.raises(UsageError, match="--use_mde_embeddings with --save_checkpoint_path.*--nouse_mde_embeddings"):
            parse_args(base + [flag, str(tmp_path)], "dlrm")
    assert not parse_args(base + ["--nouse_mde_embeddings", "--save_checkpoint_path", str(tmp_path)],
                          "dlrm").use_mde_embeddings


@pytest.mark.parametrize("model", ["dlrm", "dcnv2"])
def test_parameter_table_lists_every_flag_with_its_default(model):
    table = parameter_table(model)
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in table.splitlines()[2:]}
    flags = {a.option_strings[0] for a in build_parser(model)._actions
             if a.option_strings and a.dest != "help" and a.help != "==SUPPRESS=="}
    assert set(rows) == flags
    assert rows["--learning_rate"] == str(MODEL_DEFAULTS[model]["learning_rate"] * 1.0)
    assert rows["--synthetic_dataset_hotness"] == "26x20"
    assert rows["--top_mlp_dims"] == "1024,1024,512,256,1"
    assert all(line.count("|") == 4 for line in table.splitlines())
