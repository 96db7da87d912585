"""Wide & Deep on Outbrain (TensorFlow 2): data generation and NVTabular ETL (``wide_deep.data``); model and
training follow. Importing this package imports neither TensorFlow nor NVTabular."""
