"""Data of the Wide & Deep recipe: ``loader`` (the parquet batches training and evaluation read),
``wide_deep.data.outbrain`` (the Outbrain Click Prediction data: generator and ETL), ``movielens`` (the MovieLens
example's readers of its ETL output)."""
