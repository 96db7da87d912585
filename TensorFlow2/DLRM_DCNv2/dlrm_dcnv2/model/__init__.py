"""TensorFlow 2 DLRM and DCNv2 recipe."""
