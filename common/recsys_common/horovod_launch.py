"""Did a launcher start this process as one of several ranks, and does Horovod agree? (framework-free)

The TensorFlow recipes initialise Horovod only under a launcher, so that a plain ``python main.py`` needs no Horovod.
Launchers say so in the environment: ``horovodrun`` (``HOROVOD_*``), ``mpirun`` (``OMPI_COMM_WORLD_SIZE``), PMI
(``PMI_SIZE``), and Slurm's ``srun`` (``SLURM_STEP_NUM_TASKS`` / ``SLURM_NTASKS``; under ``srun --mpi=pmix`` the MPI
variables only exist after MPI starts, so Slurm's are the ones a rank sees first). When a launcher says several
tasks but Horovod comes up with one (a Horovod without MPI under ``srun``, a plain ``python`` in an ``sbatch``
script of several tasks), every task would train alone on the whole job's work and nobody would notice:
:func:`check_world_size` stops it with the reason instead.

Usage::

    if launched():
        hvd.init()
        check_world_size(hvd.size())      # LauncherMismatchError naming the variable and both sizes
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

# In order of precedence: the launcher closest to the process first (horovodrun inside a Slurm allocation sets
# HOROVOD_SIZE for its own ranks while SLURM_NTASKS still describes the allocation).
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
# Set for a rank of a Horovod/MPI launcher whatever the world size.
RANK_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class LauncherMismatchError(RuntimeError):
    """The launcher started several ranks but Horovod sees fewer: each would train alone."""


def expected_world_size(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, int]]:
    """``(variable, size)`` of the launcher closest to this process, or None when no launcher variable is set."""
    environ = os.environ if environ is None else environ
    for name in SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            try:
                return name, int(value.split("(")[0])
            except ValueError:
                continue
    return None


def launched(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when a launcher started this process as a rank: a Horovod/MPI variable, or Slurm saying several tasks."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in RANK_VARIABLES):
        return True
    expected = expected_world_size(environ)
    return expected is not None and expected[1] > 1


def check_world_size(horovod_size: int, environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise :class:`LauncherMismatchError` when the launcher's task count is larger than ``horovod_size``."""
    expected = expected_world_size(environ)
    if expected is None or expected[1] <= horovod_size:
        return
    name, size = expected
    raise LauncherMismatchError(
        f"the launcher started {size} tasks ({name}={size}) but Horovod sees {horovod_size}: every task would train "
        f"alone. Under srun, Horovod must be built with MPI (HOROVOD_WITH_MPI=1, as in the NGC image) and started "
        f"with srun --mpi=pmix (slurm_multinode.sh), or use LAUNCHER=gloo (horovodrun --gloo); in an sbatch script "
        f"of several tasks, start the training through srun or slurm_multinode.sh, not a plain python")
