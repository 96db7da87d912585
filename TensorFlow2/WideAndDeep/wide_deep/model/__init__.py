"""The Wide & Deep model's parts.

- ``config``: what the model needs to know (``ModelConfig``, the embedding widths file, the configurations built from
  a feature spec: Outbrain's and the MovieLens example's); imports no TensorFlow.
- ``network``: the tf-keras layers and models (``WidePart``, ``DeepPart``, ``Dropout16``, ``WideDeepModel``, the
  MovieLens example's ``DeepOnlyModel``) and their builders (``build_model``, ``build_movielens_model``).
- ``optimizers``: FTRL + RMSprop and the one training step (``make_train_step``).
- ``schedule``: the deep part's learning-rate schedule.
"""
