"""Serving Wide & Deep: the commands over :mod:`wide_deep.serving` and ``recsys_common.serving`` (nothing in the
``wide_deep`` package imports them).

* ``deploy.py``: checkpoint -> Triton model repository (NVIDIA's ``triton/export_model.py`` runs it).
* ``evaluate_accuracy.py``, ``evaluate_latency.py``: clients of a running Triton server (on a CPU
  machine: ``python -m recsys_common.serving.triton_server`` on the ``--triton-backend python`` repository);
  ``triton/evaluate_*.py`` run them.
* ``predict.py``: click probabilities for a user's rows from a checkpoint, without a server (``python predict.py``).

Run as files (``python deployment/deploy.py ...``) or, from the recipe directory, as ``python -m deployment.deploy``.
"""
