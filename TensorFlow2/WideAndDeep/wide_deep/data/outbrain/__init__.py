"""Outbrain Click Prediction data for Wide & Deep.

Modules (data flow top to bottom):
- ``raw``: the seven raw Kaggle CSVs (reference B.3): schemas, the checked reader, the real-sample reader.
- ``generator``: synthetic raw CSVs with consistent keys, skew and a planted signal
  (``python -m wide_deep.data.outbrain.generator``).
- ``features``: the 29 model features (reference B.4): names, kinds, hash buckets, max hotness, embedding sizes.
- ``nvtabular.workflow``: the joins and split (pandas) and the NVTabular workflow that makes the 29 features.
- ``preproc``: the ETL entry point (``python -m wide_deep.data.outbrain.preproc``, ``scripts/preproc.sh``), writing
  ``train/`` and ``valid/`` parquet, ``feature_spec.yaml`` and the saved workflow.
- ``embedding_sizes.json``: the default embedding widths (``--embedding_sizes_file``), equal to
  ``features.EMBEDDING_SIZES`` (a test checks).
"""
