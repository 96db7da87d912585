"""check_shared_directory with two ranks as two threads: one directory seen by both passes (and leaves nothing
behind); a directory per rank (node-local disks) fails on both ranks, before anything is written there."""
import threading

import pytest

from recsys_common.shared_storage import DirectoryNotSharedError, check_shared_directory


def run_two_ranks(roots):
    """Run check_shared_directory on ranks 0 and 1 (``roots[r]``: the path as rank r sees it); returns each
    rank's exception or None. The collectives are a two-party barrier with a shared slot."""
    barrier = threading.Barrier(2, timeout=30)
    slots = {}

    def broadcast(rank):
        def collective(text):
            if rank == 0:
                slots["text"] = text
            barrier.wait()
            value = slots["text"]
            barrier.wait()
            return value
        return collective

    def count(rank):
        def collective(flag):
            slots[f"flag{rank}"] = bool(flag)
            barrier.wait()
            total = slots["flag0"] + slots["flag1"]
            barrier.wait()
            return total
        return collective

    errors = [None, None]

    def rank_main(rank):
        try:
            check_shared_directory(roots[rank], rank, 2, broadcast(rank), count(rank), wait_s=0.5)
        except Exception as e:  # noqa: BLE001  (the test looks at it)
            errors[rank] = e
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_a_shared_directory_passes_and_is_left_as_it_was(tmp_path):
    root = tmp_path / "ckpt"
    assert run_two_ranks([str(root), str(root)]) == [None, None]
    assert root.is_dir() and list(root.iterdir()) == []


def test_node_local_directories_fail_on_every_rank(tmp_path):
    errors = run_two_ranks([str(tmp_path / "node0" / "ckpt"), str(tmp_path / "node1" / "ckpt")])
    for error in errors:
        assert isinstance(error, DirectoryNotSharedError), errors
        assert "1 of 2 ranks do not see the files rank 0 writes there" in str(error)
        assert "--save_checkpoint_path" in str(error) and "shared by all nodes" in str(error)
    assert list((tmp_path / "node0" / "ckpt").iterdir()) == []   # the probe is removed
    assert not (tmp_path / "node1" / "ckpt").exists()


def test_one_rank_checks_nothing(tmp_path):
    check_shared_directory(str(tmp_path / "never"), 0, 1, broadcast=None, count=None)
    assert not (tmp_path / "never").exists()
    with pytest.raises(DirectoryNotSharedError):
        check_shared_directory(str(tmp_path / "x"), 0, 2, broadcast=lambda t: t, count=lambda f: 1)
