"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.prepare_synthetic_dataset`` runs :mod:`dlrm_dcnv2.data.prepare_synthetic_dataset`."""
from dlrm_dcnv2.data.prepare_synthetic_dataset import command

if __name__ == "__main__":
    command()
