"""The deployer: checkpoint -> Triton model repository (config.pbtxt checked with Triton's protobuf definitions through
recsys_common.serving), and its refusals (existing repository, mismatching flags, missing checkpoint)."""
import os

import pytest

from test_serving_export import ONNX_TOLERANCE, checkpoint  # noqa: F401  (module-scoped fixture)


def test_deployer_writes_a_triton_repository(checkpoint, small_dataset, tmp_path):
    from deployment import deploy as deployer
    from recsys_common.serving.model_config import check_model_directory
    from recsys_common.serving.repository import read_sidecar
    repo = tmp_path / "repo"
    result = deployer.deploy(["--ts-trace", "--onnx", "--deploy_cpu", "--triton-max-batch-size", "4096",
                              "--triton-dyn-batching-delay", "0.5", "--triton-engine-count", "2", "--save-dir",
                              str(repo), "--", "--model_checkpoint", checkpoint, "--dataset", small_dataset,
                              "--bottom_mlp_sizes", "32", "16", "--embedding_dim", "16", "--check_rows", "256"])
    assert sorted(p for p in os.listdir(repo) if not p.startswith(".")) == ["dlrm-onnx", "dlrm-ts"]
    assert max(result["max_abs_diff"].values()) <= ONNX_TOLERANCE
    onnx_config = check_model_directory(str(repo / "dlrm-onnx"))
    ts_config = check_model_directory(str(repo / "dlrm-ts"))
    assert onnx_config.platform == "onnxruntime_onnx" and ts_config.platform == "pytorch_libtorch"
    assert onnx_config.max_batch_size == 4096
    assert onnx_config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(onnx_config.dynamic_batching.preferred_batch_size) == [2048, 4096]
    assert onnx_config.instance_group[0].count == 2
    assert [(i.name, list(i.dims)) for i in onnx_config.input] == [("numerical", [13]), ("categorical", [8])]
    sidecar = read_sidecar(str(repo / "dlrm-onnx"))
    assert sidecar["inputs"]["categorical"]["max_id"] == [1000, 500, 200, 100, 50, 20, 10, 5]
    assert sidecar["feature_spec"]["channel_spec"]["categorical"][0] == "cat_0.bin"


def test_capped_hashed_tables_deploy_against_their_dataset(small_dataset, tmp_path):
    """A model trained with --max_table_size --hash_indices has its larger tables capped: ``deployer --dataset`` and
    ``evaluate_accuracy`` (which compare the checkpoint's tables with the FeatureSpec's cardinalities) accept it, and
    still refuse a FeatureSpec the model was not trained on."""
    from conftest import TABLE_SIZES, train_args
    from deployment import deploy as deployer
    from dlrm import serving
    from dlrm.train import main
    ck = str(tmp_path / "ck")
    main(train_args(small_dataset, tmp_path / "log.json", "--max_steps", "4", "--max_table_size", "300",
                    "--hash_indices", "--save_checkpoint_path", ck))
    result = deployer.deploy(["--onnx", "--deploy_cpu", "--save-dir", str(tmp_path / "repo"), "--model_checkpoint", ck,
                              "--dataset", small_dataset, "--check_rows", "64"])
    assert result["config"]["table_sizes"] == [300, 300, 200, 100, 50, 20, 10, 5]
    assert max(result["max_abs_diff"].values()) <= ONNX_TOLERANCE
    _, config, _ = serving.load_model(ck, table_sizes=TABLE_SIZES)        # what evaluate_accuracy passes
    assert config.hash_indices
    with pytest.raises(serving.ModelMismatchError, match=r"embedding table 2 \(cat_2.bin\) has 200 rows .* 250"):
        serving.load_model(ck, table_sizes=[1000, 500, 250, 100, 50, 20, 10, 5])
    with pytest.raises(serving.ModelMismatchError, match=r"embedding table 1 \(cat_1.bin\) has 300 rows .* 280"):
        serving.load_model(ck, table_sizes=[1000, 280, 200, 100, 50, 20, 10, 5])


def test_deployer_refuses_bad_input(checkpoint, small_dataset, tmp_path, capsys):
    from deployment import deploy as deployer
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("mine")
    base = ["--onnx", "--save-dir", str(repo), "--model_checkpoint", checkpoint, "--check_rows", "0"]
    assert deployer.main(base) == 2  # an existing, non-empty repository without --overwrite
    assert "overwrite" in capsys.readouterr().err
    assert deployer.main(base + ["--overwrite"]) == 0
    assert (repo / "notes.txt").read_text() == "mine"  # a file the tool did not write survives --overwrite
    assert deployer.main(base + ["--overwrite", "--top_mlp_sizes", "64,16,1"]) == 2
    assert "top MLP layer 1 has 32 units in the checkpoint, --top_mlp_sizes gives 16" in capsys.readouterr().err
    assert deployer.main(["--ts-script", "--ts-trace", "--model_checkpoint", checkpoint]) == 2
    assert "choose one" in capsys.readouterr().err
    assert deployer.main(["--onnx", "--save-dir", str(tmp_path / "r2"), "--model_checkpoint",
                          str(tmp_path / "nothing")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def test_readme_deployer_table_matches_the_parser():
    """Every deployer flag is in the README's Deployment table with its real default (the table is checked, so the
    two never drift)."""
    import re
    from conftest import RECIPE_DIR
    from deployment.deploy import build_parser
    text = open(os.path.join(RECIPE_DIR, "README.md")).read()
    section = text[text.index("## Deployment"):text.index("## What differs")]
    rows = {}
    for flags, default in re.findall(r"^\| ((?:`--[\w-]+`(?:, )?)+) \| ([^|]*) \|", section, re.M):
        names = re.findall(r"`(--[\w-]+)`", flags)
        defaults = [d.strip() for d in default.split(", ")]
        for i, name in enumerate(names):
            rows[name] = defaults[i] if len(defaults) == len(names) else None
    parser = {a.option_strings[0]: a.default for a in build_parser()._actions if a.option_strings
              and a.dest != "help"}
    assert set(rows) == set(parser), (sorted(set(parser) - set(rows)), sorted(set(rows) - set(parser)))
    for name, default in rows.items():
        if default is not None:
            assert default == str(parser[name]), name
