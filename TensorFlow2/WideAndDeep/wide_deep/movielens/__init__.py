"""The MovieLens example (the flow of NVIDIA's HugeCTR MovieLens notebook, with this recipe's tools).

``etl``: MovieLens ratings (ml-100k, ml-1m, or the CSV layout of ml-20m/ml-25m/ml-latest) -> an NVTabular workflow
(userId, movieId categorified, genres multi-hot, label rating > 3) -> parquet ``train/``, ``valid/`` (parts of
``--part_rows`` ratings), ``feature_spec.yaml`` and the saved workflow; streamed, in bounded memory.
``generate``: a MovieLens directory in the ml-20m/ml-25m layout (ratings.csv, movies.csv) at any size, ML-25M's by
default, for running the example at its real size where GroupLens' files are absent.
``baseline``: the popularity baseline (an item's training positive rate) and its AUC.
``train``: the recipe's Wide & Deep model in its deep-only configuration (embeddings of width 16, sum combiner,
Dense 128-128-1), Adam, AUC every ``--eval_interval`` steps, atomic snapshots, export for serving (SavedModel and
the model graph as JSON).
"""
