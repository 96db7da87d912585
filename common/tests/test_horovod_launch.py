"""Which launcher started this rank and how many ranks it says, and the refusal when Horovod sees fewer."""
import pytest

from recsys_common.horovod_launch import LauncherMismatchError, check_world_size, expected_world_size, launched


@pytest.mark.parametrize("environ, is_rank, expected", [
    ({}, False, None),
    ({"SLURM_NTASKS": "1"}, False, ("SLURM_NTASKS", 1)),                    # python in a one-task allocation
    ({"SLURM_NTASKS": "16"}, True, ("SLURM_NTASKS", 16)),                   # srun --mpi=pmix before MPI starts
    ({"SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "8"}, True, ("SLURM_STEP_NUM_TASKS", 8)),
    ({"SLURM_NTASKS": "16", "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, True, ("HOROVOD_SIZE", 2)),  # horovodrun
    ({"OMPI_COMM_WORLD_SIZE": "4"}, True, ("OMPI_COMM_WORLD_SIZE", 4)),
    ({"PMI_SIZE": "1"}, True, ("PMI_SIZE", 1)),
])
def test_launcher_and_its_world_size(environ, is_rank, expected):
    assert launched(environ) is is_rank
    assert expected_world_size(environ) == expected


def test_several_tasks_but_one_horovod_rank_is_refused_naming_the_variable():
    with pytest.raises(LauncherMismatchError, match=r"started 16 tasks \(SLURM_NTASKS=16\) but Horovod sees 1"):
        check_world_size(1, {"SLURM_NTASKS": "16"})
    check_world_size(16, {"SLURM_NTASKS": "16"})
    check_world_size(2, {"SLURM_NTASKS": "16", "HOROVOD_SIZE": "2"})     # horovodrun -np 2 inside an allocation
    check_world_size(1, {})
