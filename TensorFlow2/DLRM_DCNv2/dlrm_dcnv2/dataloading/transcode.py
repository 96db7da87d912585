"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.transcode`` runs :mod:`dlrm_dcnv2.data.transcode`."""
from dlrm_dcnv2.data.transcode import command

if __name__ == "__main__":
    command()
