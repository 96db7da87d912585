"""Outbrain Click Prediction data for Wide & Deep.

Modules (data flow top to bottom):
- ``raw``: the seven raw Kaggle CSVs (reference B.3): schemas, the checked readers (whole, and streamed in typed
  blocks), the real-sample reader.
- ``generator``: synthetic raw CSVs with consistent keys, skew and a planted signal
  (``python -m wide_deep.data.outbrain.generator``).
- ``features``: the 29 model features (reference B.4): names, kinds, hash buckets, max hotness, embedding sizes.
- ``joins``: stage 1 out of core: the joins and the train/valid split, display range by display range.
- ``tables``: the joins and split on whole tables (the definition stage 1 is tested against), the per-page lists
  and TF-IDF matrices (pandas/numpy/scipy).
- ``engine``: the default stage 2 engine (pandas/numpy/pyarrow/scipy, no NVTabular): NVTabular 23.8's operators
  written out, fitted on train and applied partition by partition, statistics saved without pickle
  (``load_fitted``).
- ``nvtabular.workflow``: the NVTabular workflow that makes the 29 features (``--engine nvtabular``; the only module
  here that imports NVTabular, and only that engine imports it).
- ``preproc``: the ETL entry point (``python -m wide_deep.data.outbrain.preproc [--engine default|nvtabular]``,
  ``preproc/prepare_dataset.sh``), writing ``train/`` and ``valid/`` parquet, ``feature_spec.yaml`` and ``workflow/``.
- ``embedding_sizes.json``: the default embedding widths (``--embedding_sizes_file``), equal to
  ``features.EMBEDDING_SIZES`` (a test checks).

ETL speed and memory at several sizes, and the join engines compared: ``benchmarks/etl.py`` and
``benchmarks/joins.py`` at the recipe root.
"""
