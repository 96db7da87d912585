"""Reading ahead on a background thread: the data pipelines' one framework-free prefetcher.

Reading and decoding the next chunk or batch (file reads, decompression, NumPy conversions, which release the GIL)
can overlap with the work on the current one. :func:`prefetched` runs an iterator on a daemon thread, ``depth``
items ahead, and keeps three promises:

* **order**: items come out in the order the iterator yields them (one producer, one FIFO queue);
* **errors**: an exception raised while producing is raised to the consumer, after the items produced before it;
* **stopping**: when the consumer stops early (``break``, an exception, ``close()``), the producer stops after the
  item it is producing and its thread is joined; nothing is left running.

    >>> list(prefetched(iter(range(5)), depth=2))
    [0, 1, 2, 3, 4]
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()     # end of the items (with no error) or the producer's failure (with its error)


def prefetched(items: Iterable[T], depth: int = 1, name: str = "prefetch") -> Iterator[T]:
    """Yield ``items`` as a background thread (named ``name``) produces them, at most ``depth`` ahead."""
    if depth < 1:
        raise ValueError(f"prefetch depth must be at least 1, got {depth}")
    handoff: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                handoff.put((item, None))   # blocks while the consumer is depth items behind
                if stop.is_set():
                    return
            handoff.put((_DONE, None))
        except BaseException as error:     # noqa: B902 - handed to the consumer, which raises it
            handoff.put((_DONE, error))

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item, error = handoff.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        # A producer blocked on a full queue needs room to see the stop: take items until it has ended.
        while worker.is_alive():
            try:
                handoff.get(timeout=0.05)
            except queue.Empty:
                pass
        worker.join()
