"""End a ``torch.distributed`` run so that every rank exits 0: one teardown for every multi-process entry point.

Imports torch only inside the functions: ``recsys_common`` itself stays framework-free.

Why a plain ``destroy_process_group()`` at the end of ``main`` is not enough with gloo (read from torch 2.13):

* ``destroy_process_group()`` only unregisters the group. The gloo backend (its ``pt_gloo_runloop`` worker threads and
  its ``gloo_tcp_loop`` thread) lives on while anything still references the group: a ``DistributedDataParallel``
  reducer, TorchRec's ``DistributedModelParallel`` and its sharded modules (their all-to-all "dists" keep the group),
  a pending ``Work``, and default arguments of torch's own functions (``def all_gather(tensor, group=group.WORLD)`` in
  ``torch.distributed.nn.functional``, ``_broadcast_object`` of ``ZeroRedundancyOptimizer``'s module):
  ``group.WORLD`` is evaluated when such a module is first imported, which DDP's constructor and TorchRec do after the
  group exists; torch then keeps the group for the life of the process.
* The abort reported at exit ("terminate called without an active exception", SIGABRT, after the run printed its
  summary) is what a gloo thread still at work while the interpreter exits can do: a worker thread releasing the last
  collective it ran drops tensors that Python created (all-to-all outputs, gathered parts), which needs the GIL; once
  the interpreter is finalizing, a thread asking for the GIL is ended with ``pthread_exit``, and that unwinding
  through a C++ destructor calls ``std::terminate``. A race, hence "once in a few runs", more often on a loaded
  machine; torchrun then fails a job that trained well. Seen on a 2-core AMD EPYC (2026-11-24): DLRM's 2-process
  training aborted so in 1 of 26 runs before this teardown (in none of 60 torchrun jobs after), and a one-process
  script that leaves the threads alive to the exit in 1 of 10.

:func:`shutdown_process_group` therefore drops what it can reach, meets the other ranks at a barrier, destroys the
group and lets the backend go while the interpreter is fully alive: the backend's destructor joins its worker threads
(with the GIL released), so no gloo thread is left to race the interpreter's exit. Callers must drop their own
references to DDP/DMP models first (return from the function that built them, or set the variables to ``None``).
"""
from __future__ import annotations

import gc
import os
import types
from typing import List

# Names torch and gloo give their threads (Linux): the worker threads of ProcessGroupGloo and gloo's TCP event loop.
GLOO_THREAD_NAMES = ("pt_gloo_runloop", "gloo_tcp_loop")


def shutdown_process_group(barrier: bool = True) -> bool:
    """Tear the default process group (and every other group) down on this rank; call it on every rank.

    ``barrier``: meet the other ranks before destroying, so that no rank destroys the group while another still
    communicates. Pass ``False`` on an error path: a rank that failed must not wait at a barrier that ranks still
    inside a collective would never reach (torchrun stops them once this rank exits non-zero).

    Returns ``True`` if a group existed and was destroyed. Safe without a group (returns ``False``), safe to call
    twice, and a no-op where ``torch.distributed`` is not built in.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    # DDP reducers and DMP's sharded modules sit in reference cycles: collect them now, so that the group is only
    # referenced by torch's registries when it is destroyed.
    gc.collect()
    if barrier and dist.get_world_size() > 1:
        dist.barrier()
    groups = list(_known_groups(dist))
    dist.destroy_process_group()
    _forget_stale_defaults(groups)
    # The group objects are now unreferenced; collecting joins the backend's threads here, not at interpreter exit.
    del groups
    gc.collect()
    return True


def live_gloo_threads() -> List[str]:
    """Names of this process's gloo threads still alive (Linux ``/proc``; an empty list elsewhere).

    Empty after :func:`shutdown_process_group` when nothing else held the group: what tests check.
    """
    task_dir = f"/proc/{os.getpid()}/task"
    names = []
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return names
    for task in tasks:
        try:
            with open(os.path.join(task_dir, task, "comm")) as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(GLOO_THREAD_NAMES):
            names.append(name)
    return sorted(names)


def _known_groups(dist) -> list:
    """Every process group torch knows of (the default one included), before they are destroyed."""
    from torch.distributed import distributed_c10d as c10d
    groups = list(getattr(c10d._world, "pg_map", {}).keys())
    default = c10d.GroupMember.WORLD
    if default is not None and all(g is not default for g in groups):
        groups.append(default)
    return groups


def _forget_stale_defaults(groups: list) -> None:
    """Replace destroyed groups captured as default arguments by torch's own functions with ``None``.

    Some torch functions take ``group=group.WORLD`` as a default, evaluated when their module is imported: e.g.
    ``torch.distributed.nn.functional.all_gather`` and
    ``torch.distributed.optim.zero_redundancy_optimizer._broadcast_object``. If that import happened while a group
    existed (DDP's constructor and TorchRec import them lazily), the default keeps that group, and so its gloo threads,
    alive until the interpreter exits. ``None`` means "the default group" to every collective, which is what the
    default meant. Only modules of the torch family (``torch*``) are looked at, functions and methods alike.
    """
    import sys
    if not groups:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch"):
            continue
        try:
            members = list(vars(module).values())
        except TypeError:
            continue
        for member in members:
            candidates = [member]
            # type(), never isinstance() or getattr(): isinstance falls back to ``obj.__class__``, and some of torch's
            # lazy or deprecated objects run code on attribute access (a FutureWarning, a CUDA initialisation).
            if type(member) is type and vars(member).get("__module__") == name:
                candidates += list(vars(member).values())
            for candidate in candidates:
                kind = type(candidate)
                function = candidate.__func__ if kind in (staticmethod, classmethod) else candidate
                if type(function) is types.FunctionType:
                    _replace_defaults(function, groups)


def _replace_defaults(function, groups: list) -> None:
    defaults = function.__defaults__
    if defaults and any(_is_one_of(d, groups) for d in defaults):
        function.__defaults__ = tuple(None if _is_one_of(d, groups) else d for d in defaults)
    kwdefaults = function.__kwdefaults__
    if kwdefaults and any(_is_one_of(d, groups) for d in kwdefaults.values()):
        function.__kwdefaults__ = {k: None if _is_one_of(d, groups) else d for k, d in kwdefaults.items()}


def _is_one_of(value, groups: list) -> bool:
    return any(value is g for g in groups)
