"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.gen_csv`` runs :mod:`dlrm_dcnv2.data.gen_csv`."""
from dlrm_dcnv2.data.gen_csv import command

if __name__ == "__main__":
    command()
