"""recsys_common.prefetch: order, errors after the items before them, and no thread left behind on an early stop."""
import threading
import time

import pytest

from recsys_common.prefetch import prefetched


def _threads(name):
    return [t for t in threading.enumerate() if t.name == name]


def test_items_in_order_and_an_error_after_the_items_before_it():
    assert list(prefetched(iter(range(100)), depth=3, name="t-order")) == list(range(100))

    def fails_at_3():
        yield from range(3)
        raise OSError("chunk 3: read failed")
    got = []
    with pytest.raises(OSError, match="chunk 3: read failed"):
        for item in prefetched(fails_at_3(), depth=2, name="t-error"):
            got.append(item)
    assert got == [0, 1, 2] and not _threads("t-error")
    with pytest.raises(ValueError, match="at least 1"):
        next(prefetched(iter([1]), depth=0))


def test_an_early_stop_stops_the_producer_and_joins_its_thread():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1
    stream = prefetched(endless(), depth=2, name="t-stop")
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.close()                      # what a `break` out of the consumer's loop does
    assert not _threads("t-stop")       # joined, not left running
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count <= 5 + 2 + 2   # stopped within the read-ahead, nothing produced after
