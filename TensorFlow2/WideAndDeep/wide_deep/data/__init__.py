"""Datasets of the Wide & Deep recipe. ``wide_deep.data.outbrain``: the Outbrain Click Prediction data."""
