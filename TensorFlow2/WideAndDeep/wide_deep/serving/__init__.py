"""Serving of the recipe's models (issue 10): export to a Triton model repository, accuracy through a KServe-v2
server, predictions without a server. Entry points: ``triton/export_model.py``, ``triton/evaluate_accuracy.py``,
``triton/evaluate_latency.py`` and ``predict.py`` (``main(argv)`` functions in :mod:`.export`, :mod:`.accuracy`,
:mod:`.latency`, :mod:`.predict`)."""
