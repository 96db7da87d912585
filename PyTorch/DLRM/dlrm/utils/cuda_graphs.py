"""CUDA graphs for the MLPs of the training step (``--cuda_graphs``, CUDA only).

The bottom MLP and the top MLP are captured with ``torch.cuda.make_graphed_callables`` (forward and backward), so
each runs as one graph launch instead of dozens of small kernel launches; the embedding lookup and the interaction
stay eager, so TorchRec's fused embedding backward and its collectives are untouched. Graphs need fixed shapes:
batches of another size (the last one) run eagerly. Graphed MLPs bypass DistributedDataParallel's forward, so they
are used only with one process; with more, the step runs eagerly (a warning says so).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist


class GraphedDLRM:
    def __init__(self, trainable, amp, batch_size: int, num_tables: int, num_numerical: int, device: torch.device):
        self.trainable = trainable
        self.core = trainable.core
        self.batch_size = batch_size
        self.enabled = not (dist.is_initialized() and dist.get_world_size() > 1)
        if not self.enabled:
            warnings.warn("--cuda_graphs is used with one process only; running eagerly", stacklevel=2)
            return
        core = self.core
        numerical = torch.randn(batch_size, num_numerical, device=device)
        categorical = torch.zeros(batch_size, num_tables, dtype=torch.int64, device=device)
        with amp.autocast():
            bottom = core.bottom_mlp(numerical).detach()
            interaction = core.interaction(bottom, core.embeddings(categorical).detach()).detach()
        interaction.requires_grad_(True)
        self.bottom = self._graph(core.bottom_mlp, (numerical,), amp)
        self.top = self._graph(core.top_mlp, (interaction,), amp)

    @staticmethod
    def _graph(module, sample_args, amp):
        with amp.autocast():
            torch.cuda.make_graphed_callables(module, sample_args)
        graphed = module.forward
        del module.forward  # make_graphed_callables patched the instance; keep the eager forward for odd shapes
        return graphed

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        if not self.enabled or numerical.shape[0] != self.batch_size:
            return self.trainable.module(numerical, categorical)
        core = self.core
        if core.hash_indices:
            categorical = torch.remainder(categorical, core._sizes)
        bottom = self.bottom(numerical)
        embedded = core.embeddings(categorical)
        return self.top(core.interaction(bottom, embedded)).squeeze(1)
