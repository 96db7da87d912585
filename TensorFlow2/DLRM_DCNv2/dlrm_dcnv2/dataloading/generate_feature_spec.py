"""NVIDIA's name: ``python -m dlrm_dcnv2.dataloading.generate_feature_spec`` runs :mod:`dlrm_dcnv2.data.generate_feature_spec`."""
from dlrm_dcnv2.data.generate_feature_spec import command

if __name__ == "__main__":
    command()
