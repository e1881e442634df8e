"""The ``sdpa_last`` attention kernel of a plain view: fused attention plus the newest query's weights.

A generation trace needs, per layer and step, only the newest query's attention row
``[head, key]``. :func:`sdpa_last_attention` is registered with transformers under the
name ``"lensprobe_sdpa_last"`` (see :data:`ATTENTIONS`): the prompt forward runs fused
sdpa plus that row (:func:`last_query_weights`); a cached decode step (one query) computes
the weights once and multiplies them by the values (:func:`last_query_attention`).
"""

import torch
from torch import nn

from lensprobe.core.lazy import heavy
from lensprobe.generation.engines.threads import one_thread

__all__ = ["ATTENTIONS", "last_query_attention", "last_query_weights", "register_sdpa_last", "sdpa_last_attention"]

ATTENTIONS = {"eager": "eager", "sdpa": "sdpa", "sdpa_last": "lensprobe_sdpa_last"}
"""Attention implementations of a plain view -> the transformers implementation name."""


def register_sdpa_last() -> None:
    """Register :func:`sdpa_last_attention` (and sdpa's mask) with transformers, once."""
    masking = heavy("transformers.masking_utils")
    attention_functions = heavy("transformers.modeling_utils").ALL_ATTENTION_FUNCTIONS
    name = ATTENTIONS["sdpa_last"]
    if name not in attention_functions:
        attention_functions.register(name, sdpa_last_attention)
        masking.ALL_MASK_ATTENTION_FUNCTIONS.register(name, masking.sdpa_mask)


_DECODE_KWARGS = frozenset({"position_ids", "cache_position", "output_attentions", "use_cache", "is_causal",
                            "sliding_window"})
"""Keyword arguments an attention call may carry and still take the one-query path of
:func:`sdpa_last_attention` (anything else, e.g. ``softcap``, ``sinks``, goes through sdpa)."""


def sdpa_last_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                        **kwargs):
    """Attention output plus the newest query's attention weights ``[batch, head, 1, key]``.

    ``query`` ``[batch, head, q, d]`` is post-RoPE and ``key`` ``[batch, kv_head, key, d]``
    holds every cached key (GQA: query head ``h`` reads kv head ``h // group``);
    ``attention_mask`` is sdpa's boolean mask (``True`` = attend) or ``None`` (attend to all,
    which holds for the newest query under a causal mask).

    Several queries (the prompt forward): fused sdpa, plus :func:`last_query_weights`. One
    query (a cached decode step) with no dropout or other extras: the weights are computed
    once and give the output too (:func:`last_query_attention`), instead of sdpa computing
    them again.
    """
    sdpa_attention_forward = heavy("transformers.integrations.sdpa_attention").sdpa_attention_forward
    if query.shape[2] == 1 and not dropout and all(k in _DECODE_KWARGS or v is None for k, v in kwargs.items()):
        with one_thread():
            return last_query_attention(query, key, value, attention_mask, scaling)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    with one_thread():
        return out, last_query_weights(query, key, attention_mask, scaling)


def _last_query_probs(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None) -> torch.Tensor:
    """softmax(q_last . k * scale + mask) over the keys, as ``[batch, kv_head, key, group]`` floats.

    GQA without copying the keys: each kv group's keys ``[key, d]`` multiply the group's
    query heads ``[d, group]`` in one matmul. (Keys on the left: with the keys transposed on
    the right, the CPU matmul keeps a kernel per key length, which grows memory by tens of
    MiB over a long generation.)
    """
    b, h, _q, d = query.shape
    kv = key.shape[1]
    scale = d ** -0.5 if scaling is None else scaling
    q = query[:, :, -1, :].reshape(b, kv, h // kv, d).transpose(-1, -2)  # [b, kv, d, group]
    scores = torch.matmul(key, q).float() * scale  # [b, kv, key, group]
    if attention_mask is not None:
        last = attention_mask[:, :, -1, : scores.shape[-2]]  # [b, 1 or h, key]
        last = (last.reshape(b, 1, -1, 1) if last.shape[1] == 1
                else last.reshape(b, kv, h // kv, -1).transpose(-1, -2))
        scores = (scores.masked_fill(~last, float("-inf")) if last.dtype == torch.bool
                  else scores + last.float())
    return torch.softmax(scores, dim=-2)


def _as_rows(probs: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``[batch, kv_head, key, group]`` probabilities as ``[batch, head, 1, key]`` weights in the query's dtype."""
    return probs.transpose(-1, -2).reshape(query.shape[0], query.shape[1], 1, -1).to(query.dtype)


def last_query_weights(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                       scaling: float | None = None) -> torch.Tensor:
    """softmax(q_last . k * scale + mask) for the newest query: ``[batch, head, 1, key]``.

    ``attention_mask`` is boolean (``True`` = attend) or additive, ``[batch, 1 or head, q,
    key]``, or ``None``; ``scaling`` defaults to ``1 / sqrt(d)``.
    """
    return _as_rows(_last_query_probs(query, key, attention_mask, scaling), query)


def last_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the newest query: output ``[batch, 1, head, d]`` and weights ``[batch, head, 1, key]``.

    The output is laid out as transformers' attention functions return it (query position
    before head). Values on the left of the matmul, as the keys in the scores.
    """
    b, h, _q, d = query.shape
    probs = _last_query_probs(query, key, attention_mask, scaling)  # [b, kv, key, group]
    out = torch.matmul(value.transpose(-1, -2), probs.to(value.dtype))  # [b, kv, d, group]
    out = out.transpose(-1, -2).reshape(b, 1, h, value.shape[-1])
    return out, _as_rows(probs, query)
