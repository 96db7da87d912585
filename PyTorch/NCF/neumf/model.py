"""The three NCF instantiations of He et al. (WWW'17): GMF, MLP and NeuMF.

Every model maps a batch of ``(user, item)`` id pairs to one logit per pair
(the probability of an interaction is ``sigmoid(logit)``; training uses
``BCEWithLogitsLoss``). They are built from two branches:

* :class:`GMFBranch`  ``phi_GMF = p_u * q_i``  (element-wise product of a user and
  an item embedding, ``factors`` wide) -- matrix factorisation.
* :class:`MLPBranch`  ``phi_MLP = a_L(W_L ... a_1(W_1 [p'_u ; q'_i]))`` -- user and
  item embeddings of ``layers[0] // 2`` each, concatenated and passed through
  ``Linear -> ReLU -> Dropout`` blocks of the sizes in ``layers[1:]``.

and a final ``Linear(width, 1)`` (:class:`Predictor`):

* ``GMF``   = Predictor(phi_GMF)
* ``MLP``   = Predictor(phi_MLP)
* ``NeuMF`` = Predictor([phi_GMF ; phi_MLP])  (separate embeddings per branch)

Initialisation follows NVIDIA's recipe: embeddings ~ N(0, 0.01) (``embedding_init_std``, ncf.py's
``--embedding_init_std``), MLP weights Glorot-uniform, the final layer LeCun-uniform, biases zero.

>>> import torch
>>> model = NeuMF(num_users=4, num_items=5, factors=8, layers=[16, 8], dropout=0.0)
>>> model(torch.tensor([0, 3]), torch.tensor([1, 4])).shape
torch.Size([2])
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

MODEL_NAMES = ("neumf", "gmf", "mlp")


def _glorot_uniform_(layer: nn.Linear) -> None:
    fan_out, fan_in = layer.weight.shape
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(layer.weight, -limit, limit)
    nn.init.zeros_(layer.bias)


def _lecun_uniform_(layer: nn.Linear) -> None:
    fan_in = layer.weight.shape[1]
    limit = math.sqrt(3.0 / fan_in)
    nn.init.uniform_(layer.weight, -limit, limit)
    nn.init.zeros_(layer.bias)


@torch.compiler.disable  # inductor's own CPU dropout draws one Philox number per element: slower than this
def _cpu_dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """``keep / (1 - p)`` in ``x``'s dtype and shape, drawn 16 bits per element (see :class:`Dropout`)."""
    threshold = round(p * 65536)
    # 64 random bits per draw, read as four int16; int16 + 32768 is uniform on [0, 65536)
    bits = torch.randint(-2 ** 63, 2 ** 63 - 1, (x.numel() // 4,), dtype=torch.int64, device=x.device)
    keep = bits.view(torch.int16).view(x.shape) >= threshold - 32768
    return keep.to(x.dtype).mul_(65536.0 / (65536 - threshold))


class Dropout(nn.Dropout):
    """``nn.Dropout(p)`` whose CPU training mask is drawn 16 bits at a time: about 5x faster on CPU than ATen's
    ``bernoulli_`` (one Mersenne-twister float per element), which was the largest item of an eager CPU training
    step with NVIDIA's MLP and dropout 0.5 (a third of the step, measured with torch.profiler on an AMD EPYC).

    Each element is kept when a uniform 16-bit integer is at least ``round(p * 65536)``, so the drop probability is
    ``p`` to within 1/65536 (exact for 0.5), and kept elements are scaled by the exact inverse keep rate. Under
    ``torch.compile`` the mask is still drawn this way (outside the graph) and the product is compiled. On CUDA and
    in eval mode it is ``nn.functional.dropout`` / the identity. No parameters: state dicts are those of ``nn.Dropout``.

    >>> d = Dropout(0.5).train()
    >>> y = d(torch.ones(4, 1000))
    >>> sorted(set(y.flatten().tolist())), abs(float((y == 0).float().mean()) - 0.5) < 0.05
    ([0.0, 2.0], True)
    """

    def __init__(self, p: float):  # a subclass of nn.Dropout: the same state dicts and isinstance checks
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return self._train_forward(x)

    @torch.jit.unused
    def _train_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.numel() % 4:
            return nn.functional.dropout(x, self.p, training=True)
        return x * _cpu_dropout_mask(x, self.p)


class GMFBranch(nn.Module):
    """Generalized matrix factorisation: ``p_u * q_i``.

    Takes ``users`` and ``items`` (int64 ``[B]``), returns float ``[B, factors]``.

    >>> GMFBranch(3, 4, factors=2)(torch.tensor([0]), torch.tensor([3])).shape
    torch.Size([1, 2])
    """

    def __init__(self, num_users: int, num_items: int, factors: int, embedding_init_std: float = 0.01):
        super().__init__()
        self.user_embedding = nn.Embedding(num_users, factors)
        self.item_embedding = nn.Embedding(num_items, factors)
        nn.init.normal_(self.user_embedding.weight, 0.0, embedding_init_std)
        nn.init.normal_(self.item_embedding.weight, 0.0, embedding_init_std)
        self.output_width = factors

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.user_embedding(users) * self.item_embedding(items)


class MLPBranch(nn.Module):
    """Learned similarity: an MLP over the concatenated user and item embeddings.

    ``layers[0]`` is the width of ``[p'_u ; q'_i]`` (so each embedding has
    ``layers[0] // 2`` dimensions); each further size adds a
    ``Linear -> ReLU -> Dropout(dropout)`` block. Returns ``[B, layers[-1]]``.

    >>> MLPBranch(3, 4, layers=[8, 4], dropout=0.0)(torch.tensor([0]), torch.tensor([3])).shape
    torch.Size([1, 4])
    """

    def __init__(self, num_users: int, num_items: int, layers: Sequence[int], dropout: float,
                 embedding_init_std: float = 0.01):
        super().__init__()
        if layers[0] % 2 != 0:
            raise ValueError(f"--layers: the first size ({layers[0]}) must be even: it is split between "
                             "the user and the item embedding")
        half = layers[0] // 2
        self.user_embedding = nn.Embedding(num_users, half)
        self.item_embedding = nn.Embedding(num_items, half)
        nn.init.normal_(self.user_embedding.weight, 0.0, embedding_init_std)
        nn.init.normal_(self.item_embedding.weight, 0.0, embedding_init_std)
        blocks = []
        for width_in, width_out in zip(layers[:-1], layers[1:]):
            linear = nn.Linear(width_in, width_out)
            _glorot_uniform_(linear)
            blocks += [linear, nn.ReLU()]
            if dropout > 0:  # NVIDIA: "if equal to 0 will not use dropout at all"
                blocks.append(Dropout(dropout))
        self.mlp = nn.Sequential(*blocks)
        self.output_width = layers[-1]

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.user_embedding(users), self.item_embedding(items)], dim=1)
        return self.mlp(x)


class Predictor(nn.Module):
    """``Linear(width, 1)`` turning branch features ``[B, width]`` into logits ``[B]``."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, 1)
        _lecun_uniform_(self.linear)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features).squeeze(1)


class GMF(nn.Module):
    """GMF baseline of the NCF paper: logit = h^T (p_u * q_i) + b."""

    def __init__(self, num_users: int, num_items: int, factors: int, embedding_init_std: float = 0.01, **_unused):
        super().__init__()
        self.gmf = GMFBranch(num_users, num_items, factors, embedding_init_std)
        self.predictor = Predictor(self.gmf.output_width)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.gmf(users, items))


class MLP(nn.Module):
    """MLP baseline of the NCF paper: logit = h^T MLP([p'_u ; q'_i]) + b."""

    def __init__(self, num_users: int, num_items: int, layers: Sequence[int], dropout: float,
                 embedding_init_std: float = 0.01, **_unused):
        super().__init__()
        self.mlp = MLPBranch(num_users, num_items, layers, dropout, embedding_init_std)
        self.predictor = Predictor(self.mlp.output_width)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.mlp(users, items))


class NeuMF(nn.Module):
    """Neural matrix factorisation: logit = h^T [p_u * q_i ; MLP([p'_u ; q'_i])] + b."""

    def __init__(self, num_users: int, num_items: int, factors: int, layers: Sequence[int], dropout: float,
                 embedding_init_std: float = 0.01):
        super().__init__()
        self.gmf = GMFBranch(num_users, num_items, factors, embedding_init_std)
        self.mlp = MLPBranch(num_users, num_items, layers, dropout, embedding_init_std)
        self.predictor = Predictor(self.gmf.output_width + self.mlp.output_width)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.predictor(torch.cat([self.gmf(users, items), self.mlp(users, items)], dim=1))


def build_model(name: str, num_users: int, num_items: int, factors: int, layers: Sequence[int],
                dropout: float, embedding_init_std: float = 0.01) -> nn.Module:
    """The model called ``name`` (one of :data:`MODEL_NAMES`); embeddings drawn from N(0, ``embedding_init_std``)."""
    classes = {"neumf": NeuMF, "gmf": GMF, "mlp": MLP}
    if name not in classes:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES}")
    return classes[name](num_users=num_users, num_items=num_items, factors=factors,
                         layers=list(layers), dropout=dropout, embedding_init_std=embedding_init_std)


def fix_gmf_predictor(model: nn.Module) -> None:
    """Make a :class:`GMF` a plain dot product ``p_u . q_i + b``: ``h`` set to ones and frozen (the bias is learned).

    The NCF paper (section 3.2) notes that GMF with ``h`` a uniform vector of 1 is matrix factorisation; this is the
    MF Rendle et al. (2020) tune to HR@10 0.7294 on the paper's ML-1M split with SGD. Trained by SGD from NVIDIA's
    LeCun-uniform ``h`` (|h| < 0.22) the logit is a product of three small factors and barely moves for tens of
    epochs. The checkpoint is an ordinary GMF state dict (``h`` = ones): it fuses into NeuMF as any GMF does.

    >>> g = GMF(3, 4, factors=2); fix_gmf_predictor(g)
    >>> g.predictor.linear.weight.tolist(), g.predictor.linear.weight.requires_grad
    ([[1.0, 1.0]], False)
    """
    if not isinstance(model, GMF):
        raise ValueError("a fixed (all-ones) GMF predictor applies to --model gmf only")
    with torch.no_grad():
        model.predictor.linear.weight.fill_(1.0)
    model.predictor.linear.weight.requires_grad_(False)


def neumf_state_from_pretrained(gmf_state: dict, mlp_state: dict, alpha: float = 0.5) -> dict:
    """A :class:`NeuMF` state dict initialised from a trained :class:`GMF` and :class:`MLP`, as the NCF paper does
    (section 3.4.1): each branch's embeddings and MLP layers are copied, and the predictor is the concatenation
    ``h = [alpha * h_GMF ; (1 - alpha) * h_MLP]`` with bias ``alpha * b_GMF + (1 - alpha) * b_MLP``, so that the
    initial NeuMF logit is the ``alpha``-weighted sum of the two pretrained logits.

    >>> g, m = GMF(3, 4, factors=2), MLP(3, 4, layers=[4, 2], dropout=0.0)
    >>> n = NeuMF(3, 4, factors=2, layers=[4, 2], dropout=0.0)
    >>> _ = n.load_state_dict(neumf_state_from_pretrained(g.state_dict(), m.state_dict()))
    >>> u, i = torch.tensor([0, 2]), torch.tensor([1, 3])
    >>> torch.allclose(n(u, i), 0.5 * g(u, i) + 0.5 * m(u, i))
    True
    """
    gmf_state, mlp_state = strip_ddp_prefix(gmf_state), strip_ddp_prefix(mlp_state)
    if "gmf.user_embedding.weight" not in gmf_state or any(k.startswith("mlp.") for k in gmf_state):
        raise ValueError("the GMF checkpoint does not hold a GMF model (train it with --model gmf)")
    if "mlp.user_embedding.weight" not in mlp_state or any(k.startswith("gmf.") for k in mlp_state):
        raise ValueError("the MLP checkpoint does not hold an MLP model (train it with --model mlp)")
    state = {k: v for k, v in gmf_state.items() if k.startswith("gmf.")}
    state.update({k: v for k, v in mlp_state.items() if k.startswith("mlp.")})
    state["predictor.linear.weight"] = torch.cat([alpha * gmf_state["predictor.linear.weight"],
                                                  (1 - alpha) * mlp_state["predictor.linear.weight"]], dim=1)
    state["predictor.linear.bias"] = (alpha * gmf_state["predictor.linear.bias"]
                                      + (1 - alpha) * mlp_state["predictor.linear.bias"])
    return state


class Popularity(nn.Module):
    """Non-personalised baseline: an item's score is its number of training interactions.

    Not trained; used to check the evaluation (on the NCF paper's ML-1M split it scores HR@10 = 0.469).

    >>> Popularity(torch.tensor([0, 2]), num_items=3)(torch.tensor([5]), torch.tensor([0])).tolist()
    [1.0]
    """

    def __init__(self, train_items: torch.Tensor, num_items: int):
        super().__init__()
        self.register_buffer("counts", torch.bincount(train_items, minlength=num_items).float())

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.counts[items]


# ------------------------------------------------------------------------------------------ NVIDIA's checkpoints
# NVIDIA's NeuMF (DeepLearningExamples PyTorch/Recommendation/NCF/neumf.py) names the same parameters differently:
# four embeddings ``mf_user_embed``, ``mf_item_embed``, ``mlp_user_embed``, ``mlp_item_embed``; an ``nn.ModuleList``
# ``mlp`` holding only the Linear layers (``mlp.0``, ``mlp.1``, ...; ReLU and dropout are functional); the output
# layer ``final``. Shapes, the [GMF ; MLP] concatenation order and the maths are the same as ours, so the weights
# map one to one. Our ``mlp.mlp`` Sequential also holds ReLU and Dropout modules, so NVIDIA's ``mlp.k`` is our k-th
# Linear, at index 2k (no dropout) or 3k (with dropout).
NVIDIA_MARKER = "mf_user_embed.weight"
_NVIDIA_TO_OURS = {"mf_user_embed.": "gmf.user_embedding.", "mf_item_embed.": "gmf.item_embedding.",
                   "mlp_user_embed.": "mlp.user_embedding.", "mlp_item_embed.": "mlp.item_embedding.",
                   "final.": "predictor.linear."}


def strip_ddp_prefix(state: dict) -> dict:
    """A state dict saved from a DistributedDataParallel wrapper has every key prefixed ``module.``."""
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}


def is_nvidia_state_dict(state: dict) -> bool:
    return NVIDIA_MARKER in strip_ddp_prefix(state)


def from_nvidia_state_dict(state: dict, model: nn.Module) -> dict:
    """NVIDIA's NeuMF parameter names -> ours for ``model`` (a :class:`NeuMF`). Unknown keys are passed through
    unchanged, so that the shape/name check of the caller reports them.

    >>> m = NeuMF(3, 4, factors=2, layers=[4, 2], dropout=0.5)
    >>> nvidia = to_nvidia_state_dict(m.state_dict())
    >>> sorted(from_nvidia_state_dict(nvidia, m)) == sorted(m.state_dict())
    True
    """
    if not isinstance(model, NeuMF):
        raise ValueError("NVIDIA's checkpoints hold a NeuMF model (NVIDIA trains no GMF or MLP): use --model neumf")
    linear_positions = [i for i, layer in enumerate(model.mlp.mlp) if isinstance(layer, nn.Linear)]
    out = {}
    for key, value in strip_ddp_prefix(state).items():
        parts = key.split(".")
        if parts[0] == "mlp" and len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < len(linear_positions):
            out[f"mlp.mlp.{linear_positions[int(parts[1])]}.{parts[2]}"] = value
            continue
        for theirs, ours in _NVIDIA_TO_OURS.items():
            if key.startswith(theirs):
                key = ours + key[len(theirs):]
                break
        out[key] = value
    return out


def to_nvidia_state_dict(state: dict) -> dict:
    """Our NeuMF state dict -> NVIDIA's parameter names (what NVIDIA's ``ncf.py --load_checkpoint_path`` loads)."""
    state = strip_ddp_prefix(state)
    if "gmf.user_embedding.weight" not in state or "mlp.user_embedding.weight" not in state:
        raise ValueError("only a NeuMF state dict maps to NVIDIA's layout (NVIDIA has no GMF or MLP model)")
    linear_positions = sorted({int(k.split(".")[2]) for k in state if k.startswith("mlp.mlp.")})
    ours_to_nvidia = {ours: theirs for theirs, ours in _NVIDIA_TO_OURS.items()}
    out = {}
    for key, value in state.items():
        if key.startswith("mlp.mlp."):
            _, _, position, name = key.split(".")
            out[f"mlp.{linear_positions.index(int(position))}.{name}"] = value
            continue
        for ours, theirs in ours_to_nvidia.items():
            if key.startswith(ours):
                out[theirs + key[len(ours):]] = value
                break
        else:
            raise ValueError(f"{key}: not a NeuMF parameter")
    return out
