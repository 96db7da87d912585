"""Training utilities: learning-rate schedule, exact ROC AUC, process groups, checkpoints."""
