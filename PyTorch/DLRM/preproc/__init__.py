"""Dataset preparation for the DLRM recipe: Criteo (Spark, see prepare_dataset.sh), MovieLens-1M CTR, LR baseline."""
