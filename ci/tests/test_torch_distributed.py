"""torchrun and python -m torch.distributed.launch with 2 local ranks on gloo (loopback)."""
import numpy as np
import pytest

from launch_utils import SCRIPTS, child_env, free_port, read_rank_results, run_launcher, venv_tool

WORLD = 2


def check(results, local_rank_via_arg):
    for r, res in enumerate(results):
        assert res["rank"] == r and res["world_size"] == WORLD
        assert res["all_reduce"] == [3.0, 30.0]
        assert res["local_rank_env"] == str(r)
        assert res["local_rank_arg"] == (r if local_rank_via_arg else None)
        np.testing.assert_allclose(res["ddp_weights"], res["reference_weights"], rtol=0, atol=1e-6)
        assert not np.allclose(res["ddp_weights"], res["initial_weights"])
        assert res["gloo_threads_after_teardown"] == [], "the process group outlived the teardown"
    np.testing.assert_array_equal(results[0]["ddp_weights"], results[1]["ddp_weights"])


def test_torchrun_gloo_allreduce_and_ddp(tmp_path):
    run_launcher([venv_tool("torchrun"), "--nnodes=1", f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
                  f"--master_port={free_port()}", str(SCRIPTS / "ddp_worker.py"), str(tmp_path)], timeout=180)
    check(read_rank_results(tmp_path, WORLD), local_rank_via_arg=False)


@pytest.mark.parametrize("use_env", [False, True], ids=["local-rank-arg", "use_env"])
def test_torch_distributed_launch(tmp_path, use_env):
    cmd = [venv_tool("python"), "-m", "torch.distributed.launch", f"--nproc_per_node={WORLD}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    if use_env:
        cmd.append("--use_env")
    run_launcher(cmd + [str(SCRIPTS / "ddp_worker.py"), str(tmp_path)], timeout=180, env=child_env())
    check(read_rank_results(tmp_path, WORLD), local_rank_via_arg=not use_env)
