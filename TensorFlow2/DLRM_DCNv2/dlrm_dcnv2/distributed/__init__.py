"""Hybrid parallelism over Horovod: ``hvd_utils`` (the collectives, one-process fallback, XLA ``compile_step``),
``placement`` (which rank holds which piece of which table), ``gradients`` (allreduce of the replicated weights)."""
