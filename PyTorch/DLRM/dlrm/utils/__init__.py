"""Small shared utilities: learning-rate schedule, exact ROC AUC, mixed precision, process groups, CUDA graphs."""
