"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.prepare_clicks`` runs :mod:`dlrm_dcnv2.data.prepare_clicks`."""
from dlrm_dcnv2.data.prepare_clicks import command

if __name__ == "__main__":
    command()
