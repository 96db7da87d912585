"""Horovod 0.28.1 (our patched build) on gloo with 2 local ranks, for TensorFlow and PyTorch."""
import numpy as np
import pytest

from launch_utils import SCRIPTS, child_env, read_rank_results, run_launcher, venv_tool

WORLD = 2


def horovodrun(script, out_dir):
    run_launcher([venv_tool("horovodrun"), "-np", str(WORLD), "-H", f"localhost:{WORLD}", "--gloo",
                  "--network-interface", "lo", venv_tool("python"), str(SCRIPTS / script), str(out_dir)],
                 timeout=240, env=child_env(HOROVOD_GLOO_TIMEOUT_SECONDS=120))
    return read_rank_results(out_dir, WORLD)


@pytest.fixture(scope="module")
def tf_results(tmp_path_factory):
    return horovodrun("hvd_tf_worker.py", tmp_path_factory.mktemp("hvd_tf"))


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory):
    return horovodrun("hvd_torch_worker.py", tmp_path_factory.mktemp("hvd_torch"))


def test_horovod_tensorflow_collectives(tf_results):
    for r, res in enumerate(tf_results):
        assert res["rank"] == r and res["size"] == WORLD
        assert res["allreduce_sum"] == [3.0, 30.0]
        assert res["allreduce_avg"] == [1.5, 15.0]
        assert res["allgather"] == [0.0, 1.0]


def test_horovod_keras2_distributed_optimizer_keeps_ranks_in_sync(tf_results):
    r0, r1 = tf_results
    assert r0["keras_module"].startswith("tf_keras"), \
        f"tf.keras.Model comes from {r0['keras_module']}: TF_USE_LEGACY_KERAS=1 did not select tf-keras"
    # Different seeds gave different initial weights, and each rank saw different data ...
    assert not np.allclose(r0["initial_weights"], r1["initial_weights"])
    # ... yet after broadcast + averaged gradients both ranks hold the same, trained weights.
    np.testing.assert_allclose(r0["weights"], r1["weights"], rtol=0, atol=1e-6)
    assert not np.allclose(r0["weights"], r0["initial_weights"])
    assert r0["loss"][-1] < r0["loss"][0]


def test_horovod_torch_collectives_and_optimizer(torch_results):
    for r, res in enumerate(torch_results):
        assert res["rank"] == r and res["size"] == WORLD
        assert res["allreduce_sum"] == [3.0, 30.0]
        assert res["allreduce_avg"] == [1.5, 15.0]
        assert res["allgather"] == [0.0, 1.0]
        assert res["broadcast"] == [8.0]
    np.testing.assert_allclose(torch_results[0]["weights"], torch_results[1]["weights"], rtol=0, atol=1e-6)
