"""One process of ``tests/test_table_sharding.py`` (under torchrun, gloo): row-sharded tables in files against the
whole tables of one process (:class:`TieredTableEmbeddings` in RAM, built in this process from the same seed) on
the same global batches: the same initial rows and random stream, the same pooled rows, the same rows after every
step. Each of SGD and Adagrad, single-hot and multi-hot, in one launch (a launch costs seconds); exits non-zero (an
AssertionError) on any difference.

    python -m torch.distributed.run --nproc_per_node 2 tests/table_sharding_worker.py STORAGE_ROOT
"""
import os
import sys

import torch
import torch.distributed as dist

from dlrm.model.table_files import TieredTableEmbeddings
from dlrm.model.table_sharding import build_row_sharded
from recsys_common.torch_distributed import shutdown_process_group

# the last table has fewer rows than processes: one process owns none of it
SIZES = [50, 7, 300, 1]
DIM, LOCAL_BATCH, STEPS, LR = 4, 16, 6, 0.1


def global_ids(generator, hotness, batch):
    """``[batch, sum(hotness)]`` ids, multi-hot bags padded with -1 (each id column drawn with -1 allowed)."""
    columns = []
    for rows, h in zip(SIZES, hotness):
        low = -1 if h > 1 else 0
        columns.append(torch.randint(low, rows, (batch, h), generator=generator))
    return torch.cat(columns, 1)


def shard_rows(reference, sharded, t, name="weight"):
    whole = getattr(reference.tables[t], name).detach()
    start = sharded.local.row_offsets[t]
    return whole[start:start + sharded.local.table_sizes[t]], getattr(sharded.local.tables[t], name).detach()


def assert_same_rows(reference, sharded, adagrad, exact, when):
    for t in range(len(SIZES)):
        for name in ("weight", "adagrad_sum") if adagrad else ("weight",):
            expected, actual = shard_rows(reference, sharded, t, name)
            if exact:
                assert torch.equal(actual, expected), f"table {t} {name} {when}: {(actual - expected).abs().max()}"
            else:   # a bag whose ids fall on both processes is summed in another order
                torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7, msg=f"table {t} {name} {when}")


def main(storage_root):
    dist.init_process_group("gloo")
    for optimizer in ("sgd", "adagrad"):
        for hotness in ([1, 1, 1, 1], [1, 3, 2, 2]):
            storage = os.path.join(storage_root, f"{optimizer}_{max(hotness)}")
            compare_with_one_process(storage, optimizer == "adagrad", hotness)
    shutdown_process_group()


def compare_with_one_process(storage, adagrad, hotness):
    rank, world = dist.get_rank(), dist.get_world_size()
    exact = max(hotness) == 1   # single-hot: every pooled row is one owner's row plus zeros, the same sums
    torch.manual_seed(0)
    reference = TieredTableEmbeddings(SIZES, DIM, [False] * len(SIZES), adagrad=adagrad, eps=1e-10, hotness=hotness)
    after_reference = torch.get_rng_state()
    torch.manual_seed(0)
    sharded = build_row_sharded(SIZES, DIM, rank, world, lambda sizes: ([True] * len(sizes), None), storage,
                                adagrad=adagrad, eps=1e-10, hotness=hotness)
    assert torch.equal(torch.get_rng_state(), after_reference), "the shards drew another random stream"
    assert sharded.local.storage_dir.endswith(f"rank_{rank}") and len(sharded.local.files) > 0
    assert_same_rows(reference, sharded, adagrad, True, "at start")
    initial = [table.weight.detach().clone() for table in sharded.local.tables]
    reference.lr = sharded.lr = LR
    generator = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        ids = global_ids(generator, hotness, LOCAL_BATCH * world)
        mine = ids[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH]
        # the mean over the global batch, and over this process's batch (the processes' mean is the same loss)
        whole = reference(ids)
        (whole ** 2).sum(dim=(1, 2)).mean().backward()
        pooled = sharded(mine)
        (pooled ** 2).sum(dim=(1, 2)).mean().backward()
        expected = whole.detach()[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH]
        if exact:
            assert torch.equal(pooled.detach(), expected), f"pooled rows differ at step {step}"
        else:
            torch.testing.assert_close(pooled.detach(), expected, rtol=1e-6, atol=1e-7)
        assert_same_rows(reference, sharded, adagrad, exact, f"after step {step}")
    for t, (before, table) in enumerate(zip(initial, sharded.local.tables)):
        assert len(before) == 0 or not torch.equal(before, table.weight.detach()), f"shard {t} never moved: vacuous"
    check_uneven_batches_and_bad_ids(reference, sharded, hotness, rank, world)
    sharded.local.close()


def check_uneven_batches_and_bad_ids(reference, sharded, hotness, rank, world):
    """Evaluation with batches of different sizes per process; an id beyond its table stops every process."""
    generator = torch.Generator().manual_seed(2)
    ids = global_ids(generator, hotness, 2 * LOCAL_BATCH)
    sizes = [LOCAL_BATCH, LOCAL_BATCH - 5][:world] + [LOCAL_BATCH] * (world - 2)
    first = sum(sizes[:rank])
    with torch.no_grad():
        pooled = sharded(ids[first:first + sizes[rank]])
        torch.testing.assert_close(pooled, reference(ids)[first:first + sizes[rank]], rtol=1e-6, atol=1e-7)
    bad = ids[:2].clone()
    if rank == world - 1:
        bad[1, 0] = SIZES[0]   # only the last process holds it; every process must raise
    try:
        with torch.no_grad():
            sharded(bad)
    except IndexError as error:
        assert f"categorical feature 0: id {SIZES[0]} outside its table of {SIZES[0]} rows" in str(error), error
    else:
        raise AssertionError("an id beyond its table was looked up")


if __name__ == "__main__":
    main(sys.argv[1])
