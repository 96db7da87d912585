"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.transcribe`` runs :mod:`dlrm_dcnv2.data.transcribe`."""
from dlrm_dcnv2.data.transcribe import command

if __name__ == "__main__":
    command()
