"""Is a directory the same directory on every rank? The check multi-node checkpoints need before training.

Both DLRM recipes write one checkpoint together: every rank writes its own table shards into the directory rank 0
created, and rank 0 renames it into place. That only works when every rank sees the same directory, i.e. one node,
or a file system shared by all nodes (NFS, Lustre, GPFS...). On node-local disks each node would get a partial
checkpoint (its own shards) that nothing can load. :func:`check_shared_directory` finds that out before the first
training step and raises :class:`DirectoryNotSharedError` on every rank.

How: rank 0 creates the directory and a probe file with a random token in it; the token travels to every rank through
the job's own collective (``broadcast``, also a barrier after the write); each rank looks for the file and its token
(retrying for a few seconds: a network file system may show a new file late); ``count`` (a sum over ranks) says how
many ranks did not find it; rank 0 removes the probe. Framework-free: the caller passes its collectives::

    check_shared_directory(root, rank, world_size,
                           broadcast=lambda text: ...,     # rank 0's string on every rank
                           count=lambda flag: ...)         # number of ranks whose flag is True
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Callable

PROBE_PREFIX = ".shared_probe-"


class DirectoryNotSharedError(RuntimeError):
    """Some ranks do not see the directory rank 0 writes to (node-local storage on a multi-node job)."""


def _sees_probe(path: str, token: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == token:
                    return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def check_shared_directory(root: str, rank: int, world_size: int, broadcast: Callable[[str], str],
                           count: Callable[[bool], int], flag: str = "--save_checkpoint_path",
                           wait_s: float = 5.0) -> None:
    """Collective (every rank calls it): raise :class:`DirectoryNotSharedError` on every rank unless every rank sees
    the files rank 0 writes in ``root``. Creates ``root`` on rank 0; leaves nothing else behind. One rank: no-op."""
    if world_size <= 1:
        return
    token = ""
    if rank == 0:
        token = uuid.uuid4().hex
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, PROBE_PREFIX + token), "w", encoding="utf-8") as f:
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
    token = broadcast(token)
    probe = os.path.join(root, PROBE_PREFIX + token)
    missing = count(not _sees_probe(probe, token, wait_s if rank else 0.0))
    if rank == 0:
        try:
            os.remove(probe)
        except OSError:
            pass
    if missing:
        raise DirectoryNotSharedError(
            f"{flag} {root}: {missing} of {world_size} ranks do not see the files rank 0 writes there (node-local "
            f"storage?). A checkpoint is written by every rank into one directory, so a multi-node job needs it on a "
            f"file system shared by all nodes (NFS, Lustre, ...); give such a path")
