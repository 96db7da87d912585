"""Atomic writes: outputs appear complete under their final name, or not at all.

Every writer in the project goes through these helpers, so that a crash, a Ctrl-C or a bad input row never leaves a
half-written file that a later run would mistake for a finished one.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_path(os.path.join(d, "out.txt")) as tmp:
    ...     with open(tmp, "w") as f:
    ...         _ = f.write("hello")
    >>> open(os.path.join(d, "out.txt")).read()
    'hello'
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_sibling(path: str, is_dir: bool = False) -> str:
    """A fresh name in the same directory as ``path`` (same filesystem, so ``os.replace`` is atomic)."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    prefix = "." + os.path.basename(path) + ".tmp-"
    # mkstemp/mkdtemp create 0600/0700 entries; give them the permissions a plain open()/mkdir() would, so a
    # dataset written here is readable by other users and containers like any other file.
    if is_dir:
        name = tempfile.mkdtemp(prefix=prefix, dir=directory)
        os.chmod(name, 0o777 & ~_current_umask())
        return name
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    os.chmod(name, 0o666 & ~_current_umask())
    return name


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary file name next to ``path``; rename it to ``path`` only if the block succeeds."""
    tmp = _temporary_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (fsync'd before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(path: str, overwrite: bool = False) -> Iterator[str]:
    """Yield a temporary directory; on success it replaces ``path`` as a whole.

    ``overwrite=False`` refuses to replace an existing non-empty directory (the caller's data is never deleted by
    accident); ``overwrite=True`` removes the old directory only after the new one is complete.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise FileExistsError(f"{path}: output directory exists and is not empty (pass overwrite to replace it)")
    tmp = _temporary_sibling(path, is_dir=True)
    try:
        yield tmp
        if os.path.isdir(path):
            old = _temporary_sibling(path + ".old", is_dir=True)
            os.rmdir(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
