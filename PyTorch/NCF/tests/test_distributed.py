"""DDP on CPU (gloo) with two processes: metrics are all-reduced, training runs, every launcher works.

One node with two processes (torchrun), two nodes of one process each (two torchrun launchers on loopback, as the
README's multi-node command), and the deprecated ``torch.distributed.launch``. Every launcher must exit 0 (an abort
at exit after a good run fails), and no gloo thread may outlive the teardown.
"""
import json
import os
import subprocess
import sys

import pytest

from neumf import train as ncf_train
from conftest import NCF_DIR, REPO_ROOT
from recsys_testing import free_port, run_torchrun_nodes

SMALL = ["-b", "512", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8", "--seed", "3",
         "--valid_batch_size", "5000"]
WORKER = os.path.join(NCF_DIR, "tests", "ddp_worker.py")


def worker_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NCF_DIR, os.path.join(REPO_ROOT, "common"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def rank_results(out_dir):
    results = []
    for rank in (0, 1):
        path = os.path.join(out_dir, f"rank{rank}.json")
        assert os.path.isfile(path), f"rank {rank} wrote no result; files: {sorted(os.listdir(out_dir))}"
        with open(path) as f:
            results.append(json.load(f))
    assert [r["gloo_threads_after_teardown"] for r in results] == [[], []], "the process group outlived the teardown"
    return results


def torchrun(out_dir, argv, nnodes=1):
    """ddp_worker.py under torchrun: 1 node x 2 processes, or 2 nodes x 1 process (static rendezvous on 127.0.0.1)."""
    run_torchrun_nodes([WORKER, str(out_dir), *argv], nnodes=nnodes, nproc_per_node=2 // nnodes, rendezvous="static",
                       cwd=NCF_DIR, env=worker_env(), timeout=300)
    return rank_results(out_dir)


def train_argv(tiny_data, out_dir):
    return ["--data", tiny_data, *SMALL, "-e", "3", "--checkpoint_dir", str(out_dir / "ckpt"),
            "--log_path", str(out_dir / "ddp.json")]


@pytest.fixture(scope="module")
def one_node(tiny_data, tmp_path_factory):
    """3 epochs of 2-process training on one node; returns both ranks' results and the checkpoint directory."""
    out_dir = tmp_path_factory.mktemp("ncf_one_node")
    return torchrun(out_dir, train_argv(tiny_data, out_dir)), out_dir / "ckpt"


@pytest.mark.slow
def test_two_process_training_and_all_reduced_evaluation(tiny_data, tmp_path, one_node):
    ranks, ckpt = one_node
    assert [r["world_size"] for r in ranks] == [2, 2]
    s0, s1 = ranks[0]["summary"], ranks[1]["summary"]
    # HR/NDCG are all-reduced: every rank reports the global value
    assert s0["best_hr@10"] == s1["best_hr@10"] and s0["last"]["ndcg@10"] == s1["last"]["ndcg@10"]
    assert s0["best_hr@10"] > 0.5, s0  # two ranks x 256 rows per step learn like one process
    # the same model evaluated by one process gives the same HR (each rank held half of the users)
    single = ncf_train.main(["--data", tiny_data, *SMALL, "--mode", "test", "--log_path", str(tmp_path / "single.json"),
                       "--load_checkpoint_path", str(ckpt / "model.pth")])
    assert single["hr@10"] == pytest.approx(s0["best_hr@10"], abs=1e-12)
    assert single["ndcg@10"] == pytest.approx(s0["best_ndcg@10"], abs=1e-9)
    # and the deprecated launcher (it passes --local-rank=N without --use_env) evaluates it identically
    cmd = [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", WORKER, str(tmp_path), "--data", tiny_data, *SMALL, "--mode", "test",
           "--log_path", str(tmp_path / "t.json"), "--load_checkpoint_path", str(ckpt / "model.pth")]
    proc = subprocess.run(cmd, env=worker_env(), cwd=NCF_DIR, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tested = rank_results(tmp_path)
    assert tested[0]["summary"]["hr@10"] == tested[1]["summary"]["hr@10"] == single["hr@10"]


@pytest.mark.slow
def test_two_nodes_match_one_node(tiny_data, tmp_path, one_node):
    """Two torchrun launchers as nodes 0 and 1 (``--nnodes 2 --node_rank R --master_addr``), one process each."""
    ranks = torchrun(tmp_path, train_argv(tiny_data, tmp_path), nnodes=2)
    one = one_node[0][0]["summary"]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for r in ranks:  # same ranks, same data split and seeds: the same training, so the same metrics to the last bit
        two = r["summary"]
        assert two["best_hr@10"] == one["best_hr@10"] and two["best_ndcg@10"] == one["best_ndcg@10"]
        assert two["last"]["hr@10"] == one["last"]["hr@10"] and two["last"]["ndcg@10"] == one["last"]["ndcg@10"]
        assert two["last"]["loss"] == pytest.approx(one["last"]["loss"], rel=1e-6)
