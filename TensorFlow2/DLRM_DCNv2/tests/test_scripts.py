"""The dataset tools under NVIDIA's names (dlrm_dcnv2.dataloading.gen_csv / transcode / generate_feature_spec /
prepare_synthetic_dataset): thin layers over recsys_common, run through main(argv) and once as real commands."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import RECIPE_DIR, subprocess_env
from dlrm_dcnv2.data import gen_csv, generate_feature_spec, prepare_synthetic_dataset, transcode
from recsys_common.datasets import read_columns

SMALL_CSV = os.path.join(RECIPE_DIR, "tests", "transcoding", "small_csv.yaml")
# Published model sizes (GiB) of NVIDIA's three variants at embedding dim 128, float32 (reference A.3 / B.2), and half
# the last published digit: the sums of our cardinalities must round to them.
VARIANT_GIB = {"criteo_t15_synthetic": (15.6, 0.05), "criteo_t3_synthetic": (84.9, 0.05),
               "criteo_t0_synthetic": (421, 0.5)}


def test_gen_csv_then_transcode_to_split_binary(tmp_path):
    gen_csv.main(["--feature_spec_in", SMALL_CSV, "--output", str(tmp_path / "csv"), "--size", "500"])
    lines = (tmp_path / "csv" / "train_data.csv").read_text().splitlines()
    assert len(lines) == 500 and len(lines[0].split(",")) == 8
    assert (tmp_path / "csv" / "test_data.csv").read_text().count("\n") == 50
    spec = transcode.main(["--input", str(tmp_path / "csv"), "--output", str(tmp_path / "binary")])
    assert sorted(os.listdir(tmp_path / "binary" / "train")) == [
        "cat_0.bin", "cat_1.bin", "cat_2.bin", "cat_3.bin", "label.bin", "numerical.bin"]
    assert spec.cardinality("cat_1") == 40 and spec.cardinality("cat_2") == 300
    # 'auto' became max(id) + 1 over both mappings of the CSV
    ids = [int(line.split(",")[4]) for name in ("train_data.csv", "test_data.csv")
           for line in (tmp_path / "csv" / name).read_text().splitlines()]
    assert spec.cardinality("cat_0") == max(ids) + 1
    columns = read_columns(spec, "train")
    np.testing.assert_array_equal(columns["cat_0"].astype(np.int64), [int(line.split(",")[4]) for line in lines])
    assert str(spec.numpy_dtype("num_0")) == "float16"    # split binary stores numericals as float16 (NVIDIA)



def test_bring_your_own_csv_trains(tmp_path):
    """gen_csv -> transcode -> dcnv2 main: the bring-your-own path end to end on the transcoded split binary."""
    from dlrm_dcnv2.train import main
    gen_csv.main(["--feature_spec_in", SMALL_CSV, "--output", str(tmp_path / "csv"), "--size", "16384"])
    transcode.main(["--input", str(tmp_path / "csv"), "--output", str(tmp_path / "binary")])
    result = main(["--dataset_path", str(tmp_path / "binary"), "--cpu", "--batch_size", "512", "--valid_batch_size",
                   "1024", "--epochs", "2", "--learning_rate", "0.003", "--warmup_steps", "4", "--decay_start_step",
                   "1000", "--embedding_dim", "8", "--bottom_mlp_dims", "16,8", "--top_mlp_dims", "16,1",
                   "--num_cross_layers", "2", "--cross_layer_projection_dim", "8", "--print_freq", "1000",
                   "--log_path", "", "--seed", "1"], model="dcnv2")
    assert result["global_step"] == 64
    # Labels come from the generator's hidden logistic model; measured 0.837 after these 2 epochs (2026-11-24), 0.71
    # after one; chance is 0.5.
    assert result["auc_exact"] > 0.78

def test_gen_csv_refuses_a_spec_without_csv_chunks(tmp_path):
    binary_spec = generate_feature_spec.main(["--variant", "criteo_t15_synthetic", "--dst", str(tmp_path)])
    with pytest.raises(ValueError, match="split_binary.*gen_csv writes csv chunks only"):
        gen_csv.main(["--feature_spec_in", binary_spec.origin, "--output", str(tmp_path / "csv")])


@pytest.mark.parametrize("variant", sorted(VARIANT_GIB))
def test_generate_feature_spec_variants(tmp_path, variant):
    dst = tmp_path / "spec.yaml"
    spec = generate_feature_spec.main(["--variant", variant, "--dst", str(dst)])
    from recsys_common.feature_spec import FeatureSpec
    saved = FeatureSpec.from_yaml(str(dst))
    cardinalities = [saved.cardinality(f) for f in saved.channel_spec["categorical"]]
    assert len(cardinalities) == 26 and len(saved.channel_spec["numerical"]) == 13
    assert cardinalities == [spec.cardinality(f) for f in spec.channel_spec["categorical"]]
    assert sum(cardinalities) * 128 * 4 / 2 ** 30 == pytest.approx(VARIANT_GIB[variant][0],
                                                                       abs=VARIANT_GIB[variant][1])
    # dtypes as NVIDIA's layout: the smallest integer type that holds the cardinality
    biggest = saved.channel_spec["categorical"][int(np.argmax(cardinalities))]
    assert str(saved.numpy_dtype(biggest)) == "int32"
    with pytest.raises(FileExistsError, match="--overwrite"):
        generate_feature_spec.main(["--variant", variant, "--dst", str(dst)])
    generate_feature_spec.main(["--variant", variant, "--dst", str(dst), "--overwrite"])


def test_generate_feature_spec_t15_cardinalities_from_the_reference(tmp_path):
    spec = generate_feature_spec.main(["--variant", "criteo_t15_synthetic", "--dst", str(tmp_path)])
    assert spec.origin == str(tmp_path / "feature_spec.yaml")
    assert [spec.cardinality(f"cat_{i}.bin") for i in range(26)] == [
        7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667, 104, 4, 968,
        15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35]


def test_prepare_synthetic_dataset_default_layout_and_refusal(tmp_path):
    out = prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(tmp_path / "syn"),
                                          "--synthetic_dataset_num_entries", "640",
                                          "--synthetic_dataset_table_sizes", "7,300,70000"])
    assert [out.cardinality(f"cat_{i}.bin") for i in range(3)] == [7, 300, 70000]
    assert [str(out.numpy_dtype(f"cat_{i}.bin")) for i in range(3)] == ["int8", "int16", "int32"]
    assert os.path.getsize(tmp_path / "syn" / "train" / "numerical.bin") == 640 * 13 * 2
    assert os.path.getsize(tmp_path / "syn" / "test" / "label.bin") == 80
    with pytest.raises(FileExistsError):
        prepare_synthetic_dataset.main(["--synthetic_dataset_dir", str(tmp_path / "syn")])


def test_prepare_synthetic_dataset_from_a_variant_spec(tmp_path):
    generate_feature_spec.main(["--variant", "criteo_t3_synthetic", "--dst", str(tmp_path / "t3.yaml")])
    out = prepare_synthetic_dataset.main(["--feature_spec", str(tmp_path / "t3.yaml"), "--synthetic_dataset_dir",
                                          str(tmp_path / "syn"), "--synthetic_dataset_num_entries", "256",
                                          "--synthetic_dataset_test_entries", "32"])
    columns = read_columns(out, "test")
    assert len(columns["label"]) == 32
    for i in range(26):   # ids stay inside their (up to 48.9M-row) tables
        ids = columns[f"cat_{i}.bin"].astype(np.int64)
        assert ids.min() >= 0 and ids.max() < out.cardinality(f"cat_{i}.bin")


def test_commands_exit_non_zero_with_one_clear_line(tmp_path):
    env = subprocess_env()
    ok = subprocess.run([sys.executable, "-m", "dlrm_dcnv2.dataloading.generate_feature_spec", "--variant",
                         "criteo_t0_synthetic", "--dst", str(tmp_path)], cwd=RECIPE_DIR, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "882,774,559 embedding rows" in ok.stdout, ok.stderr
    again = subprocess.run([sys.executable, "-m", "dlrm_dcnv2.dataloading.generate_feature_spec", "--variant",
                            "criteo_t0_synthetic", "--dst", str(tmp_path)], cwd=RECIPE_DIR, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2   # bad input (recsys_common.cli.run_main)
    assert again.stderr.strip() == (f"generate_feature_spec.py: error: {tmp_path / 'feature_spec.yaml'}: exists; "
                                    f"pass --overwrite to replace it")
    bad = subprocess.run([sys.executable, "-m", "dlrm_dcnv2.dataloading.prepare_synthetic_dataset",
                          "--synthetic_dataset_dir", str(tmp_path / "x"), "--synthetic_dataset_table_sizes", "10,abc"],
                         cwd=RECIPE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--synthetic_dataset_table_sizes" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------- preproc/prepare_dataset.sh
PREPARE = os.path.join(RECIPE_DIR, "preproc", "prepare_dataset.sh")


def _run_prepare(args, tmp_path, **env_overrides):
    env = {k: v for k, v in subprocess_env().items()
           if k not in ("INPUT_PATH", "OUTPUT_PATH", "BINARY_PATH", "SPARK_LOCAL_DIRS", "FREQUENCY_LIMIT",
                        "SPARK_MASTER", "OVERWRITE", "SPARK_PREPROCESS_ARGS", "PREPROC_ENGINE", "PREPROC_ARGS",
                        "WORK_DIR")}
    env.update({"PYTHON": sys.executable, "INPUT_PATH": str(tmp_path / "criteo"),
                "OUTPUT_PATH": str(tmp_path / "spark"), "BINARY_PATH": str(tmp_path / "binary"),
                "SPARK_LOCAL_DIRS": str(tmp_path / "scratch"), "TOTAL_CORES": "1", "TOTAL_MEMORY": "1"})
    env.update(env_overrides)
    return subprocess.run(["bash", PREPARE, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["DGX2", "15"], "GPU Spark (NVIDIA's DGX2 configuration"),
    (["TPU"], "first argument must be CPU"),
    (["CPU", "fifteen"], "must be a non-negative integer, got 'fifteen'"),
    (["CPU", "3", "extra"], "at most two arguments"),
])
def test_prepare_dataset_rejects_bad_arguments(tmp_path, args, message):
    result = _run_prepare(args, tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "spark").exists() and not (tmp_path / "binary").exists()


def _recording_python(tmp_path):
    """A stand-in interpreter: ``python -m MODULE ARGS`` appends its argv and ``----`` to calls.txt and exits 0
    (anything else runs the real python). Returns ``(shim path, calls.txt path)``."""
    calls = tmp_path / "calls.txt"
    shim = tmp_path / "python"
    shim.write_text(f"""#!/usr/bin/env bash
if [[ "${{1:-}}" == -m ]]; then {{ printf '%s\\n' "$@"; echo ----; }} >> {calls}; exit 0; fi
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    return shim, calls


def test_prepare_dataset_calls_the_shared_job_then_the_conversion(tmp_path):
    """The script's two steps, with the arguments and environment it was given: a stand-in interpreter records
    each call (the Spark job and the conversion themselves are tested in common/tests: test_criteo_spark.py,
    test_spark_cluster.py)."""
    (tmp_path / "criteo").mkdir()
    shim, calls = _recording_python(tmp_path)
    result = _run_prepare(["CPU", "3"], tmp_path, PYTHON=str(shim), OVERWRITE="1", SPARK_MASTER="spark://head:7077",
                          SPARK_PREPROCESS_ARGS="--header yes --delimiter comma")
    assert result.returncode == 0, result.stderr
    spark, convert = [c.strip("\n").split("\n") for c in calls.read_text().split("----") if c.strip()]
    assert spark[:2] == ["-m", "recsys_common.criteo.spark_preprocess"]
    value = lambda argv, flag: argv[argv.index(flag) + 1]   # noqa: E731
    assert value(spark, "--input_path") == str(tmp_path / "criteo")
    assert value(spark, "--output_path") == str(tmp_path / "spark")
    assert value(spark, "--frequency_limit") == "3" and value(spark, "--master") == "spark://head:7077"
    assert value(spark, "--total_cores") == "1" and value(spark, "--total_memory") == "1"
    assert value(spark, "--header") == "yes" and value(spark, "--delimiter") == "comma" and "--overwrite" in spark
    assert convert == ["-m", "recsys_common.criteo.to_split_binary", "--input", str(tmp_path / "spark"),
                       "--output", str(tmp_path / "binary"), "--overwrite"]
    assert (tmp_path / "scratch").is_dir()    # SPARK_LOCAL_DIRS made for Spark's shuffle files
    # without OVERWRITE the tools get no --overwrite (they then refuse a non-empty output themselves)
    calls.unlink()
    assert _run_prepare([], tmp_path, PYTHON=str(shim)).returncode == 0
    assert "--overwrite" not in calls.read_text() and "--frequency_limit\n15\n" in calls.read_text()


def test_prepare_dataset_default_engine_is_polars_and_spark_on_request(tmp_path):
    """Without SPARK_MASTER the single-machine engine runs (one step, straight to the split-binary dataset);
    PREPROC_ENGINE=spark picks the Spark job. A stand-in interpreter records the calls."""
    (tmp_path / "criteo").mkdir()
    shim, calls = _recording_python(tmp_path)
    result = _run_prepare(["CPU", "3"], tmp_path, PYTHON=str(shim), PREPROC_ARGS="--train_ordering input")
    assert result.returncode == 0, result.stderr
    (polars,) = [c.strip("\n").split("\n") for c in calls.read_text().split("----") if c.strip()]
    assert polars == ["-m", "recsys_common.criteo.polars_preprocess", "--input_path", str(tmp_path / "criteo"),
                      "--output_path", str(tmp_path / "binary"), "--frequency_limit", "3",
                      "--train_ordering", "input"]
    calls.unlink()
    assert _run_prepare(["CPU", "3"], tmp_path, PYTHON=str(shim), PREPROC_ENGINE="spark").returncode == 0
    assert [c.strip("\n").split("\n")[1] for c in calls.read_text().split("----") if c.strip()] == [
        "recsys_common.criteo.spark_preprocess", "recsys_common.criteo.to_split_binary"]
    bad = _run_prepare(["CPU", "3"], tmp_path, PYTHON=str(shim), PREPROC_ENGINE="dask")
    assert bad.returncode == 2 and "PREPROC_ENGINE must be polars or spark" in bad.stderr


def test_prepare_dataset_stops_at_the_first_failing_step(tmp_path):
    (tmp_path / "criteo").mkdir()     # no day files: the Spark job's input check fails before Spark starts
    result = _run_prepare(["CPU", "3"], tmp_path)
    assert result.returncode == 2 and str(tmp_path / "criteo") in result.stderr
    assert not (tmp_path / "spark").exists() and not (tmp_path / "binary").exists()


# ------------------------------------------------------------------------------------------- slurm_multinode.sh
SLURM = os.path.join(RECIPE_DIR, "slurm_multinode.sh")


def _run_slurm(tmp_path, args, **env_overrides):
    """The script with stand-ins for srun / scontrol / horovodrun that record their arguments (no Slurm here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("srun", "horovodrun"):
        (bin_dir / tool).write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {tmp_path / tool}.argv\n")
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\n[[ \"$1 $2\" == 'show hostnames' ]] && "
                                      "printf 'gpu-node-a\\ngpu-node-b\\n'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "SLURM_JOB_NODELIST": "gpu-node-[a-b]",
                "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4(x2)"})
    env.update(env_overrides)
    result = subprocess.run(["bash", SLURM, *args], env=env, capture_output=True, text=True, timeout=60)
    recorded = {tool: (tmp_path / f"{tool}.argv").read_text().splitlines()
                for tool in ("srun", "horovodrun") if (tmp_path / f"{tool}.argv").exists()}
    return result, recorded


@pytest.mark.parametrize("script", ["slurm_multinode.sh", "quickstart.sh", "preproc/prepare_dataset.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", os.path.join(RECIPE_DIR, script)], check=True)


def test_slurm_multinode_mpi_launch(tmp_path):
    result, recorded = _run_slurm(tmp_path, ["dcnv2.py", "--amp", "--dataset_path", "/data/x y"],
                                  CONTAINER_IMAGE="/images/dlrm.sqsh", CONTAINER_MOUNTS="/lustre:/data")
    assert result.returncode == 0, result.stderr
    argv = recorded["srun"]
    assert argv[:2] == ["--mpi=pmix", "--nodes"] and argv[2] == "2"
    assert argv[argv.index("--ntasks-per-node") + 1] == "4"
    assert argv[argv.index("--container-image") + 1] == "/images/dlrm.sqsh"
    assert argv[argv.index("--container-mounts") + 1] == "/lustre:/data"
    assert argv[argv.index("--chdir") + 1] == "/workspace/dlrm_dcnv2"
    assert argv[-5:] == ["-u", "dcnv2.py", "--amp", "--dataset_path", "/data/x y"]
    assert "2 node(s) x 4 rank(s) = 8 ranks" in result.stdout


def test_slurm_multinode_gloo_launch(tmp_path):
    result, recorded = _run_slurm(tmp_path, ["dlrm.py", "--xla"], LAUNCHER="gloo")
    assert result.returncode == 0, result.stderr
    argv = recorded["horovodrun"]
    assert argv[:5] == ["--gloo", "-np", "8", "-H", "gpu-node-a:4,gpu-node-b:4"]
    assert argv[-2:] == [os.path.join(RECIPE_DIR, "dlrm.py"), "--xla"]


@pytest.mark.parametrize("args, env, message", [
    (["train.py"], {}, "first argument must be dlrm.py or dcnv2.py"),
    (["dlrm.py"], {"SLURM_JOB_NODELIST": ""}, "not inside a Slurm allocation"),
    (["dlrm.py"], {"LAUNCHER": "ssh"}, "LAUNCHER must be mpi or gloo"),
    (["dlrm.py"], {"LAUNCHER": "gloo", "CONTAINER_IMAGE": "x.sqsh"}, "cannot use CONTAINER_IMAGE"),
])
def test_slurm_multinode_refuses(tmp_path, args, env, message):
    result, recorded = _run_slurm(tmp_path, args, **env)
    assert result.returncode == 2 and message in result.stderr and not recorded


def test_a_task_of_several_that_horovod_sees_alone_stops(tmp_path):
    """What a rank of `srun --mpi=pmix` sees with a Horovod built without MPI (or a plain python in an sbatch script
    of several tasks): Slurm says 2 tasks, Horovod comes up with 1. It must stop before training, not train alone."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "HOROVOD_", "OMPI_", "PMI"))}
    env.update(SLURM_NTASKS="2", SLURM_PROCID="0")
    result = subprocess.run([sys.executable, "dlrm.py", "--dataset_type", "synthetic", "--cpu",
                             "--synthetic_dataset_cardinalities", "10,20", "--synthetic_dataset_hotness", "1,1",
                             "--batch_size", "48", "--embedding_dim", "4", "--bottom_mlp_dims", "8,4",
                             "--top_mlp_dims", "8,1", "--log_path", str(tmp_path / "log.json")],
                            cwd=RECIPE_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "started 2 tasks (SLURM_NTASKS=2) but Horovod sees 1: every task would train alone" in result.stderr
    assert not (tmp_path / "log.json").exists()


# ------------------------------------------------------------------------------------------- quickstart.sh
@pytest.mark.slow   # two short trainings (~30 s on 2 cores)
def test_quickstart_prints_both_aucs_and_keeps_the_previous_run(tmp_path):
    out = tmp_path / "qs"
    (out / "dlrm_checkpoint" / "step_000000001").mkdir(parents=True)      # "a previous run's" checkpoint
    (out / "log_dlrm.json").parent.mkdir(exist_ok=True)
    (out / "log_dlrm.json").write_text("previous run\n")
    env = dict(subprocess_env(), PYTHON=sys.executable, QUICKSTART_TRAIN_ROWS="8192", QUICKSTART_TEST_ROWS="4096")
    result = subprocess.run(["bash", os.path.join(RECIPE_DIR, "quickstart.sh"), str(out), "--max_steps", "3"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("quickstart: ")]
    for model in ("dlrm", "dcnv2"):
        assert any(re.fullmatch(rf"quickstart: {model}: test AUC 0\.\d{{4}} \(exact 0\.\d{{4}}\), [\d,]+ training "
                                r"samples/s", line) for line in lines), lines
        assert (out / f"{model}_checkpoint").is_dir()
    assert (out / "dlrm_checkpoint.previous" / "step_000000001").is_dir()
    assert (out / "log_dlrm.json.1").read_text() == "previous run\n"
    assert "global_step 3," in result.stdout
