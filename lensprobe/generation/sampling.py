"""The next-token distribution a generation draws from, as ``transformers`` builds it.

``transformers``' ``generate`` turns the model's logits into the scores it picks from with a
list of logits processors; the ones that change the distribution and that the papers' models'
generation configs set are applied here, in ``transformers``' order and with its semantics:

1. ``repetition_penalty`` (greedy and sampling alike; ``RepetitionPenaltyLogitsProcessor``):
   the logit of every token already in the row (prompt and generated tokens) is divided by the
   penalty when positive and multiplied by it when negative;
2. with sampling only, ``temperature`` (``TemperatureLogitsWarper``), ``top_k``
   (``TopKLogitsWarper``: the ``k`` largest scores kept, ties at the ``k``-th kept too),
   ``top_p`` (``TopPLogitsWarper``: the smallest set of most probable tokens whose mass
   reaches ``top_p``), ``min_p`` (``MinPLogitsWarper``: tokens below ``min_p`` times the top
   probability dropped); each keeps at least one token.

Greedy decoding is the ``argmax`` of the penalised scores. The entropy and the chosen token's
probability that a trace records are those of the model's own distribution (the softmax of its
logits), whatever these settings.

Example:
    >>> scores = penalised_scores(logits, seen, 1.05)        # [rows, d_vocab]
    >>> probs = sampling_probs(scores, temperature=0.7, top_k=20, top_p=0.8)
"""

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["penalised_scores", "sampling_probs"]


def penalised_scores(logits: Float[Tensor, "batch d_vocab"], seen: Bool[Tensor, "batch d_vocab"] | None,
                     penalty: float) -> Float[Tensor, "batch d_vocab"]:
    """``logits`` with the repetition penalty applied to the tokens ``seen`` in each row.

    Example:
        >>> penalised_scores(torch.tensor([[2.0, -2.0, 1.0]]), torch.tensor([[True, True, False]]), 2.0)
        tensor([[ 1., -4.,  1.]])
    """
    if seen is None or penalty == 1.0:
        return logits
    hit = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, hit, logits)


def sampling_probs(scores: Float[Tensor, "batch d_vocab"], *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, min_p: float | None = None) -> Float[Tensor, "batch d_vocab"]:
    """The distribution sampling draws from: temperature, top-k, top-p, min-p in that order.

    Args:
        scores: next-token scores (the penalised logits).
        temperature: divides the scores (``1``: unchanged).
        top_k: keep the ``top_k`` largest scores (``0``: no cut).
        top_p: keep the nucleus of mass ``top_p`` (``1``: no cut).
        min_p: drop tokens less probable than ``min_p`` times the most probable (``None``: no cut).

    Example:
        >>> sampling_probs(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), top_k=2)  # two tokens left
    """
    z = scores.float()
    if temperature != 1.0:
        z = z / temperature
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=False)
        cum = sorted_z.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[..., -1:] = False  # the most probable token stays
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    if min_p is not None and min_p > 0:
        probs = z.softmax(-1)
        drop = probs < min_p * probs.amax(-1, keepdim=True)
        z = z.masked_fill(drop, float("-inf"))  # the most probable token is never below min_p times itself
    return z.softmax(-1)
