"""The NVTabular part of the Outbrain ETL (``workflow.py``). Its absolute ``import nvtabular`` statements reach the
installed NVTabular, not this package (the name mirrors NVIDIA's ``data/outbrain/nvtabular``)."""
