"""DDP on CPU (gloo) with two processes: metrics are all-reduced, training runs, both launchers work."""
import json
import os
import subprocess
import sys

import pytest

import ncf
from conftest import NCF_DIR

SMALL = ["-b", "512", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8", "--seed", "3",
         "--valid_batch_size", "5000"]


def launch(launcher, out_dir, argv, env):
    cmd = [sys.executable, "-m", *launcher, os.path.join(NCF_DIR, "tests", "ddp_worker.py"), str(out_dir), *argv]
    proc = subprocess.run(cmd, env=env, cwd=NCF_DIR, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in (0, 1)]


@pytest.mark.slow
def test_two_process_training_and_all_reduced_evaluation(tiny_data, tmp_path, env_with_pythonpath):
    ckpt = tmp_path / "ckpt"
    ranks = launch(["torch.distributed.run", "--nproc_per_node=2", "--master_port=29517"], tmp_path,
                   ["--data", tiny_data, *SMALL, "-e", "3", "--checkpoint_dir", str(ckpt),
                    "--log_path", str(tmp_path / "ddp.json")], env_with_pythonpath)
    assert [r["world_size"] for r in ranks] == [2, 2]
    s0, s1 = ranks[0]["summary"], ranks[1]["summary"]
    # HR/NDCG are all-reduced: every rank reports the global value
    assert s0["best_hr@10"] == s1["best_hr@10"] and s0["last"]["ndcg@10"] == s1["last"]["ndcg@10"]
    assert s0["best_hr@10"] > 0.5, s0  # two ranks x 256 rows per step learn like one process
    # the same model evaluated by one process gives the same HR (each rank held half of the users)
    single = ncf.main(["--data", tiny_data, *SMALL, "--mode", "test", "--log_path", str(tmp_path / "single.json"),
                       "--load_checkpoint_path", str(ckpt / "model.pth")])
    assert single["hr@10"] == pytest.approx(s0["best_hr@10"], abs=1e-12)
    assert single["ndcg@10"] == pytest.approx(s0["best_ndcg@10"], abs=1e-9)
    # and the deprecated launcher (it passes --local-rank=N without --use_env) evaluates it identically
    tested = launch(["torch.distributed.launch", "--nproc_per_node=2", "--master_port=29518"],
                    tmp_path, ["--data", tiny_data, *SMALL, "--mode", "test", "--log_path", str(tmp_path / "t.json"),
                               "--load_checkpoint_path", str(ckpt / "model.pth")], env_with_pythonpath)
    assert tested[0]["summary"]["hr@10"] == tested[1]["summary"]["hr@10"] == single["hr@10"]
