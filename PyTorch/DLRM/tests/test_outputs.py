"""Every DLRM writer keeps what it did not write: an output directory holding the input and a user's notes.txt is
refused without --overwrite and, with it, the notes and the input survive; a crash part-way never leaves an old
feature_spec.yaml over a mix of old and new files; --output_json never clobbers a file that is not a JSON result."""
import json
import os

import pytest

from conftest import load_benchmark
from dlrm.scripts import gen_csv, prepare_synthetic_dataset, transcode
from preproc import logistic_baseline, movielens_ctr
from recsys_common.datasets import read_columns
from recsys_common.feature_spec import FeatureSpec
from recsys_common.io import OutputDirectoryError

benchmark = load_benchmark("throughput")
benchmark_preprocess = load_benchmark("preprocess")

HERE = os.path.dirname(os.path.abspath(__file__))
SYNTHETIC = ["--synthetic_dataset_num_entries", "800", "--synthetic_dataset_table_sizes", "10,300"]


def _files(directory):
    return {os.path.relpath(os.path.join(r, n), directory): open(os.path.join(r, n), "rb").read()
            for r, _, names in os.walk(directory) for n in names}


def test_prepare_synthetic_dataset_keeps_the_users_files(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes")
    FeatureSpec.get_default_feature_spec(13, [10, 300]).to_yaml(str(tmp_path / "my_spec.yaml"))   # an input
    args = ["--synthetic_dataset_dir", str(tmp_path), "--feature_spec", str(tmp_path / "my_spec.yaml"), *SYNTHETIC]
    with pytest.raises(OutputDirectoryError, match="not empty.*--overwrite"):
        prepare_synthetic_dataset.main(args)
    prepare_synthetic_dataset.main(args + ["--overwrite"])
    out = prepare_synthetic_dataset.main(args + ["--overwrite", "--synthetic_dataset_num_entries", "400"])
    assert (tmp_path / "notes.txt").read_text() == "my notes" and (tmp_path / "my_spec.yaml").exists()
    assert len(read_columns(out, "train")["label"]) == 400


def test_prepare_synthetic_dataset_overwrite_that_dies_part_way_leaves_no_old_spec_over_new_files(tmp_path,
                                                                                                  monkeypatch):
    out_dir = tmp_path / "syn"
    prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(out_dir), *SYNTHETIC])
    before = _files(out_dir)
    from recsys_common.datasets import DatasetWriter
    real_write = DatasetWriter.write

    def disk_full_on_the_test_mapping(self, columns):   # train is written, then the generator dies
        if self.mapping == "test":
            raise OSError("No space left on device")
        real_write(self, columns)

    monkeypatch.setattr(DatasetWriter, "write", disk_full_on_the_test_mapping)
    with pytest.raises(OSError, match="No space left"):
        prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(out_dir), *SYNTHETIC, "--overwrite",
                                        "--seed", "99"])
    monkeypatch.setattr(DatasetWriter, "write", real_write)
    assert _files(out_dir) == before                     # the old dataset, whole: not new train under the old spec
    real_replace, moved = os.replace, []

    def killed_while_moving_files_in(src, dst):
        if ".recsys_tmp-" in str(src) and ".recsys_tmp-" not in str(dst):
            moved.append(dst)
            if len(moved) == 3:
                raise KeyboardInterrupt   # Ctrl-C / a kill between two renames
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_while_moving_files_in)
    with pytest.raises(KeyboardInterrupt):
        prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(out_dir), *SYNTHETIC, "--overwrite",
                                        "--seed", "99"])
    monkeypatch.setattr(os, "replace", real_replace)
    after = _files(out_dir)
    assert "feature_spec.yaml" not in after
    assert not [name for name, data in after.items() if before.get(name) == data and name != ".recsys_outputs.json"]
    out = prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(out_dir), *SYNTHETIC, "--overwrite"])
    assert len(read_columns(out, "test")["label"]) == 100


def test_gen_csv_and_transcode_keep_the_users_files(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes")
    spec_in = os.path.join(HERE, "transcoding", "small_csv.yaml")
    with pytest.raises(OutputDirectoryError, match="not empty"):
        gen_csv.main(["--feature_spec_in", spec_in, "--output", str(tmp_path), "--size", "100"])
    gen_csv.main(["--feature_spec_in", spec_in, "--output", str(tmp_path), "--size", "100", "--overwrite"])
    inputs = _files(tmp_path)
    # transcode into the directory of its CSV input: the input spec's name is taken, so the output spec gets another
    args = ["--input", str(tmp_path), "--output", str(tmp_path), "--overwrite"]
    with pytest.raises(OutputDirectoryError, match="feature_spec.yaml: exists and was written by dlrm.scripts.gen_csv"):
        transcode.main(args)
    spec = transcode.main(args + ["--feature_spec_out", "binary_spec.yaml"])
    assert {k: v for k, v in _files(tmp_path).items() if k in inputs and k != ".recsys_outputs.json"} == \
        {k: v for k, v in inputs.items() if k != ".recsys_outputs.json"}
    assert len(read_columns(spec, "train")["label"]) == 100


def test_movielens_ctr_refuses_a_non_empty_output_before_reading_anything(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes")
    with pytest.raises(OutputDirectoryError, match="not empty"):
        movielens_ctr.main(["--input_dir", str(tmp_path / "no-such-input"), "--output", str(tmp_path)])
    assert _files(tmp_path) == {"notes.txt": b"my notes"}


def test_benchmark_preprocess_never_overwrites_a_train_txt_it_did_not_write(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.txt").write_text("the user's own Criteo sample\n")
    with pytest.raises(OutputDirectoryError, match="train.txt: exists and was not written by this tool"):
        benchmark_preprocess.main(["--rows", "10", "--engines", "ours", "--work_dir", str(tmp_path)])
    assert (tmp_path / "in" / "train.txt").read_text() == "the user's own Criteo sample\n"


def test_output_json_is_written_atomically_and_never_clobbers_another_file(tmp_path, monkeypatch):
    runs = []

    def fake_run(args, embedding_type, mode):   # the measurement itself is not what is tested here
        runs.append(mode)
        return {"train_samples_per_s": 1000.0 if embedding_type == "torchrec_fused" else 500.0,
                "train_step_time_s": 0.1}

    monkeypatch.setattr(benchmark, "_run_main", fake_run)
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(FileExistsError, match="run.sh: --output_json exists and is not a JSON file"):
        benchmark.main(["--compare", "embedding_types", "--repeats", "1", "--skip_inference",
                        "--output_json", str(script)])
    assert runs == [] and script.read_text() == "#!/bin/sh\n"            # refused before any run
    result_path = tmp_path / "result.json"
    for _ in range(2):                                                    # a re-run replaces its own result
        benchmark.main(["--compare", "embedding_types", "--repeats", "1", "--skip_inference",
                        "--output_json", str(result_path)])
    assert json.loads(result_path.read_text())["ratio_fused_over_multi_table"]["train_samples_per_s"] == 2.0
    with pytest.raises(FileExistsError, match="run.sh: --output_json exists and is not a JSON file"):
        logistic_baseline.main(["--dataset", str(tmp_path / "unused"), "--output_json", str(script)])
    assert script.read_text() == "#!/bin/sh\n"
