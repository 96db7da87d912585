"""Crash-safe outputs: files appear complete under their final name or not at all, and no tool deletes a file it
did not write.

Every writer in the project goes through these helpers, so that a crash, a Ctrl-C, a power loss or a bad input row
never leaves a half-written file that a later run would mistake for a finished one, and so that pointing a tool at a
directory that holds other files (its input, a user's notes) never deletes them.

Single files (``atomic_path``, ``atomic_write_bytes``, ``atomic_write_text``): written under a temporary sibling name,
fsync'd, renamed over the final name, then the directory is fsync'd so the rename itself survives a power loss.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_path(os.path.join(d, "out.txt")) as tmp:
    ...     with open(tmp, "w") as f:
    ...         _ = f.write("hello")
    >>> open(os.path.join(d, "out.txt")).read()
    'hello'

Output directories (``atomic_directory``): see its docstring. In short, a tool writes into a staging directory; on
success its files are moved into the output directory, which may hold other files; the tool records what it wrote in
``.recsys_outputs.json`` (``MANIFEST_NAME``) so that a later ``overwrite`` replaces exactly those files and nothing
else; a *marker* file (``feature_spec.yaml`` for datasets) is removed first and put back last, so a crash part-way
never leaves an old marker over a mix of old and new files.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, Iterable, Iterator, List, Optional, Set

MANIFEST_NAME = ".recsys_outputs.json"
STAGING_PREFIX = ".recsys_tmp-"


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




def _fsync_file(path: str) -> None:
    """Flush a closed file's data to disk (a rename is durable only after the data it points to is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(path: str) -> None:
    """Flush a directory's entries (creations, renames, removals) to disk.

    Some platforms and file systems cannot fsync a directory (Windows, some FUSE mounts): there the rename is as
    durable as the file system makes it, which is all that can be had.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary file name next to ``path``; on success fsync it, rename it to ``path``, fsync the directory.

    The caller writes (and closes) the temporary file inside the block; if the block raises, the file is removed and
    ``path`` is untouched.
    """
    tmp = _temporary_sibling(path)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    _fsync_directory(os.path.dirname(os.path.abspath(path)))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# ------------------------------------------------------------------------------------------------ JSON result files
def check_json_output(path: Optional[str]) -> None:
    """Refuse, before any work, a ``--output_json`` that names something other than a JSON result file.

    An existing JSON file is replaced (a benchmark re-run updates its result, as documented); anything else there (a
    directory, a script, a log) is refused so that a typo never clobbers a file the user wrote.
    """
    if not path or not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise FileExistsError(f"{path}: --output_json exists and is not a regular file; choose another path")
    try:
        with open(path, "r", encoding="utf-8") as f:
            json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise FileExistsError(f"{path}: --output_json exists and is not a JSON file; refusing to overwrite it "
                              f"(remove it or choose another path)") from None


def write_json_output(path: str, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically, after ``check_json_output``."""
    check_json_output(path)
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def report_json(result, path: Optional[str] = None):
    """A benchmark's result: printed as indented JSON, and written to ``path`` (its ``--output_json``) when given;
    returns ``result``."""
    print(json.dumps(result, indent=2))
    if path:
        write_json_output(path, result)
    return result


# ------------------------------------------------------------------------------------------------ predictions
PREDICTION_FORMATS = (".csv", ".npy", ".parquet")


def add_prediction_flags(parser, formats=PREDICTION_FORMATS, batch_size: int = 65536) -> None:
    """``--output``, ``--batch_size`` and ``--overwrite``, as every ``predict`` tool spells them (``parser``: a parser
    or an argument group; ``formats``: the extensions the tool offers, a subset of :data:`PREDICTION_FORMATS`)."""
    parser.add_argument("--output", required=True,
                        help=f"probabilities file: {', '.join(formats)} (see recsys_common.io.write_predictions)")
    parser.add_argument("--batch_size", type=int, default=batch_size, help="rows scored per model call")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")


def write_predictions(path: str, probabilities, ids=None, id_name: str = "id") -> None:
    """The recipes' one prediction writer (every ``predict.py``): one probability per row, atomically, in the format
    of ``path``'s extension:

    - ``.npy``: a float32 array (``ids`` are not written);
    - ``.csv``: a ``probability`` header, then one ``%.9g`` value a line (9 significant digits: float32 round-trips);
      with ``ids``, the header is ``<id_name>,probability`` and each line starts with its id;
    - ``.parquet``: a float32 ``probability`` column, after an ``<id_name>`` column when ``ids`` are given.

    Each tool checks the extensions it offers and refuses an existing output before its work; an extension not
    listed here is a ``ValueError``.

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "p.csv")
    >>> write_predictions(out, [0.25, 0.5], ids=[7, 9], id_name="display_id")
    >>> open(out).read()
    'display_id,probability\n7,0.25\n9,0.5\n'
    """
    import numpy as np
    ext = os.path.splitext(path)[1].lower()
    if ext not in PREDICTION_FORMATS:
        raise ValueError(f"{path}: unknown prediction file extension {ext!r}; use one of "
                         f"{', '.join(PREDICTION_FORMATS)}")
    values = np.asarray(probabilities).reshape(-1)
    with atomic_path(path) as tmp:
        if ext == ".npy":
            with open(tmp, "wb") as f:
                np.save(f, values.astype(np.float32))
        elif ext == ".csv":
            with open(tmp, "w", encoding="utf-8") as f:
                if ids is None:
                    f.write("probability\n")
                    np.savetxt(f, values, fmt="%.9g")
                else:
                    f.write(f"{id_name},probability\n")
                    f.writelines(f"{i},{p:.9g}\n" for i, p in zip(ids, values))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq
            columns = {} if ids is None else {id_name: ids}
            columns["probability"] = values.astype(np.float32)
            pq.write_table(pa.table(columns), tmp)


# ------------------------------------------------------------------------------------------------ output directories
class OutputDirectoryError(FileExistsError):
    """An output directory that a tool may not write into as asked (non-empty, or a name taken by another file)."""


def _staging_leftovers(path: str) -> List[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(STAGING_PREFIX))


def _user_entries(path: str) -> List[str]:
    """Entries of ``path`` that make it "not empty" (staging directories of interrupted runs do not count)."""
    return sorted(n for n in os.listdir(path) if not n.startswith(STAGING_PREFIX))


def check_output_directory(path: str, overwrite: bool = False) -> None:
    """Refuse early a non-empty output directory when ``overwrite`` is off (before hours of work, not after)."""
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputDirectoryError(f"{path}: output path exists and is not a directory")
    if not os.path.isdir(path):
        return
    entries = _user_entries(path)
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise OutputDirectoryError(
            f"{path}: output directory is not empty ({shown}); choose an empty or new directory, or pass --overwrite "
            f"to replace this tool's own earlier outputs there (other files are kept)")
    for name in _staging_leftovers(path):
        print(f"note: {os.path.join(path, name)} is left over from an interrupted run; delete it to reclaim its "
              f"space", file=sys.stderr)


def _safe_relative(path: str, rel: object) -> str:
    """A manifest entry, refused unless it is a plain relative path inside ``path`` (a tampered manifest must never
    make a tool delete files elsewhere)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or os.path.normpath(rel) != rel \
            or rel.split(os.sep)[0] == os.pardir:
        raise OutputDirectoryError(f"{os.path.join(path, MANIFEST_NAME)}: entry {rel!r} is not a relative path inside "
                                   f"{path}; fix or delete the manifest (and the outputs it listed) by hand")
    return rel


def read_manifest(path: str) -> Dict[str, Dict[str, object]]:
    """``{tool: {"files": [...], "directories": [...], "marker": name or None}}`` of ``path`` ({} if none)."""
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.exists(manifest_path):
        return {}
    try:
        with open(manifest_path, "r", encoding="utf-8") as f:
            data = json.load(f)
        tools = data["tools"]
        out = {}
        for tool, entry in tools.items():
            out[tool] = {"files": [_safe_relative(path, r) for r in entry.get("files", [])],
                         "directories": [_safe_relative(path, r) for r in entry.get("directories", [])],
                         "marker": entry.get("marker")}
        return out
    except OutputDirectoryError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise OutputDirectoryError(f"{manifest_path}: unreadable record of earlier outputs ({e}); without it no file "
                                   f"there can be replaced safely: delete the old outputs and the manifest by hand, "
                                   f"or write to a new directory") from None


def _write_manifest(path: str, manifest: Dict[str, Dict[str, object]]) -> None:
    tools = {tool: {"files": sorted(e["files"]), "directories": sorted(e["directories"]), "marker": e.get("marker")}
             for tool, e in sorted(manifest.items()) if e["files"] or e["directories"]}
    text = json.dumps({"format": 1, "about": "files written here by recsys tools; --overwrite replaces only these",
                       "tools": tools}, indent=1) + "\n"
    atomic_write_text(os.path.join(path, MANIFEST_NAME), text)


def _tree(root: str):
    """Relative paths of the files (and symlinks) and of the directories under ``root``."""
    files, dirs = [], []
    for current, subdirs, names in os.walk(root):
        rel = os.path.relpath(current, root)
        for d in list(subdirs):
            full = os.path.join(current, d)
            if os.path.islink(full):  # a symlink to a directory is an entry like a file; never walk through it
                subdirs.remove(d)
                files.append(os.path.normpath(os.path.join(rel, d)))
            else:
                dirs.append(os.path.normpath(os.path.join(rel, d)))
        files.extend(os.path.normpath(os.path.join(rel, n)) for n in names)
    return sorted(files), sorted(dirs)


def _fsync_tree(root: str) -> None:
    """fsync every file under ``root``, then every directory bottom-up, so the data is on disk before the renames
    that make it visible."""
    for current, _, names in os.walk(root, topdown=False):
        for name in names:
            full = os.path.join(current, name)
            if not os.path.islink(full):
                _fsync_file(full)
        _fsync_directory(current)


def _ancestors(rel: str) -> List[str]:
    parts = rel.split(os.sep)[:-1]
    return [os.sep.join(parts[:i + 1]) for i in range(len(parts))]


def _staged(staging: str, marker: Optional[str]):
    new_files, new_dirs = _tree(staging)
    if MANIFEST_NAME in new_files:
        raise ValueError(f"{staging}: a tool may not write {MANIFEST_NAME}; that name records its outputs")
    if marker is not None and marker not in new_files:
        raise ValueError(f"{staging}: the marker file {marker!r} was not written")
    return new_files, new_dirs


def _commit(staging: str, path: str, tool: str, marker: Optional[str]) -> None:
    """Move the staged outputs into ``path``, replacing only ``tool``'s earlier outputs there."""
    new_files, new_dirs = _staged(staging, marker)
    manifest = read_manifest(path)
    mine = manifest.get(tool, {"files": [], "directories": [], "marker": None})
    old_files: Set[str] = set(mine["files"])
    old_dirs: Set[str] = set(mine["directories"])
    others = {f: t for t, e in manifest.items() if t != tool for f in e["files"]}

    # Refuse before touching anything: a name this run writes that is taken by a file this tool did not write.
    for rel in new_files:
        for name in _ancestors(rel) + [rel]:
            full = os.path.join(path, name)
            is_dir_slot = name != rel
            if not os.path.lexists(full) or name in old_files:
                continue
            if is_dir_slot and os.path.isdir(full):
                continue  # writing into an existing directory (or a symlink to one) deletes nothing
            if not is_dir_slot and name in old_dirs and os.path.isdir(full) and not os.listdir(full):
                continue  # an empty directory this tool made earlier
            owner = f"written by {others[name]}" if name in others else "not written by this tool"
            hint = "" if manifest else (f"; {MANIFEST_NAME}, the record of what recsys tools wrote there, is absent "
                                        f"(outputs of a release before that record must be removed by hand)")
            raise OutputDirectoryError(f"{full}: exists and was {owner}; refusing to replace it (move it away, or "
                                       f"write to another directory){hint}")

    created_dirs = {d for d in new_dirs if not os.path.isdir(os.path.join(path, d))}
    # 1. Record every file this tool may have in the directory, old and new, before the first change, so a crash
    #    anywhere below leaves a manifest that lets a re-run with overwrite clean up.
    manifest[tool] = {"files": sorted(old_files | set(new_files)),
                      "directories": sorted(old_dirs | created_dirs), "marker": marker or mine.get("marker")}
    _write_manifest(path, manifest)
    # 2. The old marker goes first: from here on the directory does not claim to hold a complete output.
    for name in {mine.get("marker"), marker} & old_files:
        full = os.path.join(path, name)
        if os.path.lexists(full) and not os.path.isdir(full):
            os.remove(full)
            _fsync_directory(os.path.dirname(full))
    # 3. The rest of the old outputs, so the directory never holds a mix of old and new files.
    touched = {path}
    for name in sorted(old_files):
        full = os.path.join(path, name)
        if os.path.lexists(full) and (os.path.islink(full) or not os.path.isdir(full)):
            os.remove(full)
            touched.add(os.path.dirname(full))
    for name in sorted(old_dirs - set(new_dirs), key=lambda d: -d.count(os.sep)):
        with contextlib.suppress(OSError):  # kept if someone else put files there
            os.rmdir(os.path.join(path, name))
            touched.add(os.path.dirname(os.path.join(path, name)))
    for d in sorted(touched):
        if os.path.isdir(d):
            _fsync_directory(d)
    # 4. The new directories (an empty one too: a Triton ensemble's version directory holds no file), the new
    #    files, the marker last.
    for rel in sorted(created_dirs):
        os.makedirs(os.path.join(path, rel), exist_ok=True)
    touched = {path}
    for rel in [f for f in new_files if f != marker]:
        target = os.path.join(path, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(target) and not os.path.islink(target):
            os.rmdir(target)  # an empty directory of this tool's (checked above)
        os.replace(os.path.join(staging, rel), target)
        touched.add(os.path.dirname(target))
    for d in sorted(touched, key=lambda d: -d.count(os.sep)):
        _fsync_directory(d)
    still_mine = {d for d in (old_dirs | created_dirs) if os.path.isdir(os.path.join(path, d))}
    manifest[tool] = {"files": list(new_files), "directories": sorted(still_mine), "marker": marker}
    _write_manifest(path, manifest)
    if marker is not None:
        os.replace(os.path.join(staging, marker), os.path.join(path, marker))
        _fsync_directory(os.path.dirname(os.path.join(path, marker)))


@contextlib.contextmanager
def atomic_directory(path: str, overwrite: bool = False, *, tool: str = "recsys_common",
                     marker: Optional[str] = None) -> Iterator[str]:
    """Yield a staging directory to write a multi-file output into; on success its files land in ``path``.

    Args:
        path: the output directory. It may exist and hold other files (the tool's input, a user's notes): those are
            never deleted or replaced.
        overwrite: ``False`` refuses a non-empty ``path`` up front (``OutputDirectoryError``, a
            ``FileExistsError``). ``True`` replaces the files that ``tool`` wrote there before (as recorded in
            ``path/.recsys_outputs.json``) and keeps every other file.
        tool: who writes (e.g. ``"recsys_common.transcode"``); each tool replaces only its own earlier outputs, so
            one tool's output directory can hold another's input.
        marker: the file whose presence means "this output is complete" (``feature_spec.yaml`` for a dataset,
            ``meta.json`` for a checkpoint). The caller must write it into the staging directory.

    A name the new output would take that holds a file ``tool`` did not write is refused (nothing is changed). On
    commit every staged file and directory is fsync'd; then, if ``path`` did not exist, the staging directory (a
    sibling) is renamed to ``path`` in one step. Otherwise (staging inside ``path``, the same file system even when
    ``path`` is a mount point): the manifest is updated to list old and new outputs, the old marker is removed, the
    other old outputs are removed, the new files are moved in, the final manifest is written and the marker is
    moved in last, each step fsync'd. A crash part-way therefore leaves no marker over a mix of old and new files, and
    a manifest from which a re-run with ``overwrite`` cleans up. If the block raises, the staging directory is
    removed and ``path`` is untouched.
    """
    path = os.path.abspath(path)
    check_output_directory(path, overwrite)
    existed = os.path.isdir(path)
    if existed:
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=path)
        os.chmod(staging, 0o777 & ~_current_umask())
    else:
        staging = _temporary_sibling(path, is_dir=True)
    try:
        yield staging
        _fsync_tree(staging)
        if not existed and not os.path.lexists(path):
            files, dirs = _staged(staging, marker)
            _write_manifest(staging, {tool: {"files": files, "directories": dirs, "marker": marker}})
            os.rename(staging, path)
            _fsync_directory(os.path.dirname(path))
            return
        _commit(staging, path, tool, marker)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    _fsync_directory(path)
