"""``horovodrun -np 2 -H localhost:2 --gloo`` of the real entry point against one process on the same global batches.

The 2-rank run reads the two training files (one per rank, ``global_batch_size / 2`` rows each per step); the
one-rank reference reads a single file whose ``i``-th global batch is rank 0's ``i``-th batch followed by rank 1's,
so both take the same optimizer steps. Checked: both ranks end with identical weights, and the weights and the
exact validation metrics match the one-rank run (tolerances measured below). The launcher runs in a session of its
own, killed as a whole on timeout.
"""
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import RECIPE_DIR, subprocess_env
from recsys_common.feature_spec import FeatureSpec
from recsys_common.logger import read_log

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)
WORKER = os.path.join(TESTS_DIR, "hvd_worker.py")
LOCAL_BATCH = 256
TIMEOUT_S = 300
# Measured 2026-11-24: 2 ranks vs 1 rank on the same global batches, max |weight difference| 8.9e-8 and BCE
# difference 1.3e-9, AUC and MAP@12 equal (float32 sums in another order: the allreduce averages two half-batch
# gradients). Both ranks' weights are bitwise equal.
WEIGHT_TOLERANCE = 1e-5
METRIC_TOLERANCE = 1e-6


def launch_env():
    env = subprocess_env()
    env.update(GLOO_SOCKET_IFNAME="lo", HOROVOD_GLOO_TIMEOUT_SECONDS="120", OMP_NUM_THREADS="1")
    env["PATH"] = os.pathsep.join([VENV_BIN, env.get("PATH", "")])
    return env


def run_group(cmd, timeout=TIMEOUT_S):
    proc = subprocess.Popen(cmd, cwd=RECIPE_DIR, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s (process group killed)\n{output[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{output[-8000:]}"
    return output


def one_rank_dataset(two_rank_dir, out_dir):
    """A copy of the dataset whose single training file interleaves the two files' local batches."""
    shutil.copytree(two_rank_dir, out_dir)
    spec = FeatureSpec.from_yaml(os.path.join(out_dir, "feature_spec.yaml"))
    files = [spec.resolve_file(f) for f in spec.source_spec["train"][0]["files"]]
    assert len(files) == 2
    tables = [pq.read_table(f) for f in files]
    steps = min(t.num_rows for t in tables) // LOCAL_BATCH
    pieces = [t.slice(i * LOCAL_BATCH, LOCAL_BATCH) for i in range(steps) for t in tables]
    for f in files:
        os.remove(f)
    pq.write_table(pa.concat_tables(pieces), os.path.join(out_dir, "train", "interleaved.parquet"))
    spec.source_spec["train"][0]["files"] = ["train/interleaved.parquet"]
    spec.to_yaml(os.path.join(out_dir, "feature_spec.yaml"))
    return steps


def flags(dataset, results, embedding_file):
    return ["--dataset_path", dataset, "--cpu", "--global_batch_size", str(2 * LOCAL_BATCH), "--eval_batch_size",
            "1024", "--num_epochs", "1", "--deep_warmup_epochs", "0", "--deep_hidden_units", "16", "16",
            "--deep_dropout", "0", "--deep_learning_rate", "0.01", "--embedding_sizes_file", embedding_file,
            "--results_dir", results, "--model_dir", os.path.join(results, "ckpt"), "--no_shuffle"]


def summary(results):
    return [r["data"] for r in read_log(os.path.join(results, "log.json")) if r["step"] == []][-1]


@pytest.mark.slow
def test_two_ranks_match_one_rank(etl_training, tmp_path):
    import json
    from wide_deep.data.outbrain.features import EMBEDDING_SIZES
    emb = tmp_path / "emb.json"
    emb.write_text(json.dumps({name: 4 for name in EMBEDDING_SIZES}))
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    shutil.copytree(etl_training, two)
    steps = one_rank_dataset(etl_training, one)
    out2, out1 = tmp_path / "out2", tmp_path / "out1"
    out2.mkdir()
    out1.mkdir()
    output = run_group([os.path.join(VENV_BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                        "--network-interface", "lo", "sh", "hvd_wrapper.sh", sys.executable, WORKER, str(out2)]
                       + flags(two, str(out2 / "results"), str(emb)))
    assert f"step {steps}/{steps}" in output
    run_group([sys.executable, WORKER, str(out1)] + flags(one, str(out1 / "results"), str(emb)))

    rank0, rank1, single = (np.load(str(p)) for p in (out2 / "weights_0.npz", out2 / "weights_1.npz",
                                                       out1 / "weights_0.npz"))
    assert sorted(rank0.files) == sorted(single.files)
    worst = 0.0
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
        worst = max(worst, float(np.max(np.abs(rank0[name] - single[name]))))
    # training moved the weights: the comparison is not between two untouched initialisations
    bias = [name for name in rank0.files if name.endswith("wide_bias:0")]
    assert len(bias) == 1 and abs(float(rank0[bias[0]][0])) > 1e-3
    print(f"max |w(2 ranks) - w(1 rank)| = {worst:.3g}")
    assert worst < WEIGHT_TOLERANCE
    m2, m1 = summary(str(out2 / "results")), summary(str(out1 / "results"))
    print("2 ranks", m2, "1 rank", m1)
    for key in ("eval_loss", "eval_auc", "eval_map12"):
        assert abs(m2[key] - m1[key]) < METRIC_TOLERANCE, (key, m2[key], m1[key])


def test_a_task_of_several_that_horovod_sees_alone_stops(tmp_path):
    """What a rank of `srun --mpi=pmix` sees with a Horovod built without MPI (or a plain python in an sbatch script
    of several tasks): Slurm says 2 tasks, Horovod comes up with 1. It stops before reading any data, instead of
    training alone on the whole job's work."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "HOROVOD_", "OMPI_", "PMI"))}
    env.update(SLURM_NTASKS="2", SLURM_PROCID="0")
    result = subprocess.run([sys.executable, "main.py", "--dataset_path", str(tmp_path / "no_data"), "--cpu",
                             "--results_dir", str(tmp_path / "results")], cwd=RECIPE_DIR, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "started 2 tasks (SLURM_NTASKS=2) but Horovod sees 1: every task would train alone" in result.stderr
    assert not (tmp_path / "results").exists()
