"""NVIDIA's names of the dataset tools (``python -m dlrm_dcnv2.dataloading.<tool>``, after NVIDIA's
``python -m dataloading.<tool>``): each module here is a shim that runs the tool in :mod:`dlrm_dcnv2.data`."""
