"""Background prefetching of split-binary batches: same batches in the same order, errors named on the training
thread, the worker always stopped, resume equality."""
import shutil
import threading
import time

import numpy as np
import pytest
import torch

from conftest import train_args
from dlrm.data import DataError, SplitBinaryBatches, dataset_info
from dlrm.data.prefetch import Prefetcher
from dlrm.train import main

CPU = torch.device("cpu")


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dlrm-prefetch") and t.is_alive()]


def _wait_no_prefetch_threads(timeout=5.0):
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _prefetch_threads()


def _batches(dataset, prefetch, mapping="train", start_step=0, **kwargs):
    data = SplitBinaryBatches(dataset_info(dataset), mapping, kwargs.pop("batch_size", 512), CPU,
                              prefetch=prefetch, **kwargs)
    data.set_epoch(kwargs.get("epoch", 1))
    return [tuple(x.clone() if torch.is_tensor(x) else x for x in b) for b in data.iterate(start_step)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if torch.is_tensor(u):
                assert torch.equal(u, v)
            else:
                assert u == v


@pytest.mark.parametrize("kwargs", [
    {"shuffle": True, "seed": 3},                                              # shuffled training order
    {"rank": 1, "world_size": 2, "batch_size": 1024},                          # a second rank's shard
    {"training": False, "rank": 1, "world_size": 2, "batch_size": 1200},       # padded evaluation batches
])
def test_prefetched_batches_equal_the_synchronous_ones_in_order(small_dataset, kwargs):
    mapping = "test" if kwargs.get("training") is False else "train"
    synchronous = _batches(small_dataset, 0, mapping, **dict(kwargs))
    assert len(synchronous) >= 2
    for depth in (1, 3):
        _assert_same(_batches(small_dataset, depth, mapping, **dict(kwargs)), synchronous)
    assert not _wait_no_prefetch_threads()


def test_resume_from_a_step_gives_the_tail_of_the_full_pass(small_dataset):
    full = _batches(small_dataset, 2, shuffle=True, seed=5)
    for start in (0, 3, len(full) - 1, len(full)):
        _assert_same(_batches(small_dataset, 2, start_step=start, shuffle=True, seed=5), full[start:])


def test_a_bad_batch_is_raised_on_the_training_thread_naming_file_feature_and_row(small_dataset, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(small_dataset, target)
    spec = dataset_info(str(target)).spec
    # row 2000 is in local batch 3 (batch size 512): batches 0..2 must arrive before the error
    path = target / "train" / "cat_2.bin"
    dtype = spec.numpy_dtype("cat_2.bin")
    ids = np.fromfile(path, dtype=dtype)
    ids[2000] = np.iinfo(dtype).max if np.iinfo(dtype).max >= 200 else 199
    ids.tofile(path)
    data = SplitBinaryBatches(dataset_info(str(target)), "train", 512, CPU, prefetch=2)
    seen = 0
    with pytest.raises(DataError, match=r"cat_2\.bin: feature 'cat_2\.bin' row 2000 has id") as error:
        for _ in data:
            seen += 1
    assert seen == 3
    assert any("prefetch" in note for note in getattr(error.value, "__notes__", []))
    assert not _wait_no_prefetch_threads()


def test_a_file_that_disappears_is_an_error_naming_it(small_dataset, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(small_dataset, target)
    data = SplitBinaryBatches(dataset_info(str(target)), "train", 512, CPU, prefetch=2)
    (target / "train" / "cat_5.bin").unlink()  # opened lazily, on the first read
    with pytest.raises(DataError, match=r"cannot read rows 0\.\.511 .*cat_5\.bin"):
        next(iter(data))
    assert not _wait_no_prefetch_threads()


@pytest.mark.parametrize("how", ["break", "exception", "keyboard_interrupt"])
def test_the_worker_stops_when_the_consumer_leaves_early(small_dataset, how):
    data = SplitBinaryBatches(dataset_info(small_dataset), "train", 256, CPU, prefetch=2)

    def consume():
        for i, _ in enumerate(data):
            if i == 2:
                if how == "break":
                    break
                raise {"exception": RuntimeError, "keyboard_interrupt": KeyboardInterrupt}[how]("stop")
    if how == "break":
        consume()
    else:
        with pytest.raises((RuntimeError, KeyboardInterrupt)):
            consume()
    assert not _wait_no_prefetch_threads(), "the prefetch thread outlived its consumer"


def test_prefetcher_stops_a_worker_blocked_on_a_full_queue_and_when_dropped():
    produced = []

    def source():
        for i in range(10_000):
            produced.append(i)
            yield i
    p = Prefetcher(source(), depth=2, name="dlrm-prefetch-test")
    assert next(p) == 0
    time.sleep(0.2)                    # the worker fills the queue and blocks
    assert len(produced) <= 5
    p.close()
    assert not p.alive and next(p, "done") == "done"
    dropped = Prefetcher(source(), depth=1, name="dlrm-prefetch-dropped")
    del dropped                        # never closed: the worker sees the flag and ends
    assert not _wait_no_prefetch_threads()


def test_training_with_and_without_prefetch_gives_the_same_model(small_dataset, tmp_path):
    results = [main(train_args(small_dataset, tmp_path / f"log{depth}.json", "--embedding_type", "multi_table",
                               "--max_steps", "12", "--shuffle_batch_order", "--prefetch_batches", str(depth)))
               for depth in (0, 2)]
    assert results[0]["train_loss"] == results[1]["train_loss"]
    assert results[0]["evaluations"][-1]["auc"] == results[1]["evaluations"][-1]["auc"]
    assert not _wait_no_prefetch_threads()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (side-stream copies)")
def test_cuda_side_stream_batches_equal_the_synchronous_ones(small_dataset):
    info = dataset_info(small_dataset)
    cuda = torch.device("cuda")
    sync = [tuple(t.cpu() for t in b[:3]) for b in SplitBinaryBatches(info, "train", 512, cuda, prefetch=0)]
    ahead = []
    for b in SplitBinaryBatches(info, "train", 512, cuda, prefetch=2):
        torch.cuda._sleep(1_000_000)   # a slow consumer stream: the copies must still be ordered before the reads
        ahead.append(tuple((t * 1).cpu() for t in b[:3]))
    for x, y in zip(sync, ahead):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
