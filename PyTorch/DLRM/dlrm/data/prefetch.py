"""Reading batches ahead of the training step, on a worker thread (and, on CUDA, a side stream).

Reading a split-binary batch (slicing one memmap per file, converting dtypes, the range and NaN checks, pinning and
the host-to-device copy) would otherwise run on the training thread, between two steps, where nothing else runs.
:class:`Prefetcher` moves that work onto one worker thread that stays up to ``depth`` batches ahead:

* **Order**: items come out exactly in the order the source yields them (one producer, one FIFO queue), so training
  sees the same batches as without prefetching and a resumed run (``iterate(start_step)``) the same tail.
* **Errors**: an exception raised in the worker (a :class:`~dlrm.data.datasets.DataError` naming the file, feature and
  row, or anything else) is raised again on the training thread when it reaches the batch that failed, with a note
  saying it came from the prefetch thread; the batches before it are delivered first.
* **Stopping**: :meth:`Prefetcher.close` (also on ``with`` exit, and when the consuming generator is closed by a
  ``break``, an exception or ``KeyboardInterrupt``) stops the worker and joins it. The worker never blocks for long
  (timed queue operations that check a stop flag), is a daemon thread (it can never keep the interpreter alive), and
  holds no reference to the :class:`Prefetcher`, so dropping an unclosed one stops it too.

:class:`DeviceTransfer` does the device side: on a CPU nothing (the tensors are used where they are); on CUDA the
worker pins the host tensors and copies them on its own stream, recording an event; the training thread makes its
current stream wait for that event and marks the tensors as used by that stream (``record_stream``), so the caching
allocator does not hand their memory to the next batch while the step still reads it. A running worker allocates
and copies on the GPU, which a CUDA graph capture in PyTorch's default ``global`` error mode refuses: capture before
the first batch is read (``--cuda_graphs`` does, in ``train`` before the loop) or capture with
``capture_error_mode="thread_local"``.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

import torch

_ITEM, _END, _ERROR = 0, 1, 2
_POLL_S = 0.05          # how often a blocked worker or consumer looks at the stop flag / the worker's liveness
JOIN_TIMEOUT_S = 30.0   # close() waits this long for a worker inside one batch's read (it is a daemon thread anyway)


def _worker(source: Iterable, stage: Callable[[Any], Any], out: "queue.Queue", stop: threading.Event,
            device: Optional[torch.device]) -> None:
    """Produce ``stage(item)`` for each item of ``source`` into ``out`` until done, failed or ``stop`` is set."""

    def put(message) -> bool:
        while not stop.is_set():
            try:
                out.put(message, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    iterator = iter(source)
    try:
        # The CUDA device is per thread: a worker of rank r must copy to cuda:r, not to cuda:0.
        context = torch.cuda.device(device) if device is not None and device.type == "cuda" else _nullcontext()
        with context:
            for item in iterator:
                if stop.is_set() or not put((_ITEM, stage(item))):
                    return
            put((_END, None))
    except BaseException as error:  # noqa: B902 - every failure must reach the training thread
        put((_ERROR, error))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:  # a generator source: run its cleanup in the thread that ran it
            close()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class Prefetcher:
    """Iterate ``stage(item) for item in source`` computed on a worker thread, up to ``depth`` items ahead.

    Args:
        source: an iterable (usually a generator) of items; it is iterated on the worker thread only.
        depth: how many staged items may wait for the consumer (>= 1). Memory held: ``depth + 2`` items.
        stage: applied to each item on the worker thread (e.g. :meth:`DeviceTransfer.stage`).
        name: names the thread and is added to errors raised by the worker.
        device: on CUDA, the device the worker thread makes current.

    >>> with Prefetcher(iter(range(5)), depth=2, stage=lambda x: x * x) as squares:
    ...     list(squares)
    [0, 1, 4, 9, 16]
    """

    def __init__(self, source: Iterable, depth: int = 2, stage: Callable[[Any], Any] = lambda item: item,
                 name: str = "dlrm-prefetch", device: Optional[torch.device] = None):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.name = name
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # The thread gets only the queue, the flag and the source: no reference back to self (see module docstring).
        self._thread = threading.Thread(target=_worker, args=(source, stage, self._queue, self._stop, device),
                                        name=name, daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.close()
                    raise RuntimeError(f"{self.name}: the prefetch thread ended without a result or an error")
        if kind == _ITEM:
            return value
        self.close()
        if kind == _END:
            raise StopIteration
        value.add_note(f"(raised while reading ahead in thread {self.name!r})")
        raise value

    def close(self) -> None:
        """Stop the worker and wait for it (idempotent). Items not consumed are dropped."""
        self._done = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
        while True:  # drop what was read ahead (device memory on CUDA)
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    @property
    def alive(self) -> bool:
        """Whether the worker thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:  # dropped without close(): the worker sees the flag and ends on its own
            stop.set()


Tensors = Tuple[torch.Tensor, ...]


class DeviceTransfer:
    """Moves a batch's tensors to ``device``: ``stage`` on the worker thread, ``finish`` on the training thread.

    A batch is ``(tensors, extra)``: a tuple of host tensors and anything else (passed through). On a CPU both steps
    return the batch unchanged. On CUDA ``stage`` pins the host tensors and copies them on a side stream, recording
    an event; ``finish`` makes the current stream wait for the event (no host sync) and records the tensors' use on
    that stream.
    """

    def __init__(self, device: torch.device, side_stream: bool = True):
        self.device = device
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if self.cuda and side_stream else None

    def stage(self, batch: Tuple[Tensors, Any]) -> Tuple[Tensors, Any, Any]:
        tensors, extra = batch
        if not self.cuda:
            return tensors, extra, None
        pinned = [t.pin_memory() for t in tensors]
        if self._stream is None:  # synchronous path (no prefetch): the current stream copies
            return tuple(t.to(self.device, non_blocking=True) for t in pinned), extra, None
        with torch.cuda.stream(self._stream):
            moved = tuple(t.to(self.device, non_blocking=True) for t in pinned)
            event = torch.cuda.Event()
            event.record(self._stream)
        return moved, extra, event

    def finish(self, staged: Tuple[Tensors, Any, Any]) -> Tuple[Tensors, Any]:
        tensors, extra, event = staged
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in tensors:
                t.record_stream(current)
        return tensors, extra
