"""The MovieLens example (the flow of NVIDIA's HugeCTR MovieLens notebook, with this recipe's tools).

``etl``: MovieLens ratings -> an NVTabular workflow (userId, movieId categorified, genres multi-hot, label
rating > 3) -> parquet ``train/``, ``valid/``, ``feature_spec.yaml`` and the saved workflow.
``baseline``: the popularity baseline (an item's training positive rate) and its AUC.
``train``: the recipe's Wide & Deep model in its deep-only configuration (embeddings of width 16, sum combiner,
Dense 128-128-1), Adam, AUC every ``--eval_interval`` steps, atomic snapshots, export for serving (SavedModel and
the model graph as JSON).
"""
