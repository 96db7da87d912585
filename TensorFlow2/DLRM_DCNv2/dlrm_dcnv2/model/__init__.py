"""The model parts of DLRM and DCNv2 (TensorFlow code): MLPs, the interactions, the embeddings and the sparse model,
the whole model, optimizers and learning-rate schedule, the training step, evaluation and the inference benchmark;
``metrics`` holds the click-model figures in NumPy."""
