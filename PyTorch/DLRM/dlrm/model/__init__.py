"""DLRM model parts: :class:`BottomMLP`, embeddings, the interactions (:class:`DotInteraction`,
:class:`CatInteraction`, :class:`LowRankCrossInteraction`), :class:`TopMLP`, assembled by :class:`DLRM`. Parallel wrappers live in :mod:`dlrm.model.parallel`."""
from .dlrm import DLRM
from .embeddings import MultiTableEmbeddings, TorchRecEmbeddings, torchrec_available
from .interaction import CatInteraction, DotInteraction, LowRankCrossInteraction
from .mlp import MLP, BottomMLP, TopMLP

__all__ = ["DLRM", "MLP", "BottomMLP", "TopMLP", "DotInteraction", "CatInteraction", "LowRankCrossInteraction",
           "MultiTableEmbeddings", "TorchRecEmbeddings", "torchrec_available"]
