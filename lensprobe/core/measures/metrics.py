"""Metrics: pure functions of tensors (attention patterns, logits).

Patterns follow TransformerLens: ``[..., query_pos, key_pos]`` with rows summing to 1
over keys. When a pattern has fewer query rows than key columns (a KV-cached step), the
rows are the *last* query positions: row ``r`` is absolute position ``K - Q + r``.

**Non-finite input gives NaN.** A metric never turns NaN or infinity into a number: each
output value is ``NaN`` when any input value it reads is NaN or infinite (an attention
metric reads the pattern entries of its chosen queries and keys; entries it does not read
do not affect it). For logits, a row holding a NaN or ``+inf``, or whose logits are all
``-inf`` (no distribution), gives ``NaN``; a ``-inf`` logit among finite ones is a token of
probability 0 (the usual masking) and is allowed. A broken run (e.g. a NaN written into the
residual stream) therefore shows up as ``NaN``, never as a confident model.
:func:`nonfinite_rows` says which rows of logits are broken.

Inputs must be tensors; :func:`entropy` also takes a list or array of numbers (converted
with ``torch.as_tensor``).
"""

from collections.abc import Callable, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError

DEFAULT_TOKEN_CLASSES: dict[str, str | Callable[[str], bool]] = {
    "# (hash)": "#",
    "* (star)": "*",
    "whitespace": str.isspace,
}
"""Token classes of the attention-to-token-classes study (arXiv 2512.24532)."""


_ROW_BLOCK = 64


def _check_pattern(pattern: Tensor) -> None:
    if not isinstance(pattern, Tensor) or pattern.ndim < 2:
        got = f"shape {tuple(pattern.shape)}" if isinstance(pattern, Tensor) else type(pattern).__name__
        raise LensprobeError(
            f"pattern must be a tensor [..., query_pos, key_pos] (e.g. [head, q, k]), got {got}; "
            "pass an attention pattern such as lp.attention_patterns(model, prompt)[layer]."
        )
    if not pattern.is_floating_point():
        raise LensprobeError(f"pattern must hold floating-point attention weights, got a {pattern.dtype} tensor.")


def _nan_if_nonfinite(x: Tensor) -> Tensor:
    """``x`` with every infinite entry replaced by NaN (so sums and means carry NaN on)."""
    return x if bool(torch.isfinite(x).all()) else torch.where(torch.isinf(x), torch.nan, x)


def average_attention_received(pattern: Float[Tensor, "... query_pos key_pos"]
                               ) -> Float[Tensor, "... key_pos"]:
    """Average attention each key position receives from the queries after it.

    For key ``j``: the mean over query positions ``i > j`` of ``A[i, j]`` (strictly below
    the diagonal; Bogdan et al. 2025, used by the meaningless-tokens paper). The last key
    position has no later query and is ``NaN``.

    Args:
        pattern: square attention pattern ``[..., pos, pos]``, e.g. ``[head, pos, pos]``.

    Returns:
        ``[..., key_pos]``, e.g. ``[head, key_pos]``.

    Example:
        >>> A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
        >>> average_attention_received(A)
        tensor([0.3500, 0.3000,    nan])
    """
    _check_pattern(pattern)
    q, k = pattern.shape[-2:]
    if q != k:
        raise LensprobeError(
            f"average_attention_received needs a square pattern (full prompt), got {q} queries x {k} keys."
        )
    below = torch.ones(q, k, dtype=torch.bool, device=pattern.device).tril(-1)
    # Blocks of query rows keep the masked temporary small (no full-size copy of the pattern).
    total = pattern.new_zeros(pattern.shape[:-2] + (k,))
    for start in range(0, q, _ROW_BLOCK):
        stop = min(q, start + _ROW_BLOCK)
        # where, not a product: a NaN above the diagonal (never read) must not leak in.
        block = _nan_if_nonfinite(pattern[..., start:stop, :])
        total += torch.where(below[start:stop], block, 0.0).sum(-2)
    count = torch.arange(k - 1, -1, -1, device=pattern.device).to(pattern.dtype)  # queries i > j
    return total / count  # count 0 at the last key -> nan


def attention_proportion(pattern: Float[Tensor, "... query_pos key_pos"],
                         key_positions: Sequence[int] | Tensor,
                         query_positions: Sequence[int] | Tensor | None = None,
                         ) -> Float[Tensor, "..."]:
    """Attention mass that queries put on a set of key positions, averaged over the queries.

    For each chosen query ``i``: ``sum_{j in S} A[i, j]``; then the mean over the chosen
    queries. Default queries: every query position after the last key in ``S``. ``S`` and
    the queries are sets: a position listed twice counts once.

    Args:
        pattern: ``[..., query_pos, key_pos]`` (e.g. ``[head, q, k]``).
        key_positions: absolute key positions ``S``.
        query_positions: absolute query positions; ``None`` for every query after ``max(S)``.

    Returns:
        ``[...]``, e.g. ``[head]``; values in ``[0, 1]``.

    Example:
        >>> A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
        >>> attention_proportion(A, [0])  # queries 1 and 2: (0.5 + 0.2) / 2
        tensor(0.3500)
    """
    _check_pattern(pattern)
    q, k = pattern.shape[-2:]
    keys = _positions(key_positions, pattern.device)
    if keys.numel() == 0:
        raise LensprobeError("key_positions is empty: pass at least one key position.")
    if keys.min() < 0 or keys.max() >= k:
        raise LensprobeError(f"key positions must lie in 0..{k - 1}, got {keys.min().item()}..{keys.max().item()}.")
    offset = k - q  # absolute position of row 0
    if query_positions is None:
        queries = torch.arange(max(int(keys.max()) + 1, offset), k, device=pattern.device)
        if queries.numel() == 0:
            raise LensprobeError(
                "no query comes after the last key position; pass query_positions explicitly."
            )
    else:
        queries = _positions(query_positions, pattern.device)
        if queries.numel() == 0 or queries.min() < offset or queries.max() >= k:
            raise LensprobeError(f"query positions must lie in {offset}..{k - 1}.")
    # Key columns first (S is usually small), then query rows; contiguous sets are slices.
    cols = _select(pattern, -1, keys)
    return _nan_if_nonfinite(_select(cols, -2, queries - offset)).sum(-1).mean(-1)


def _select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """``x.index_select(dim, index)`` for a sorted index, as a view when it is a contiguous range."""
    first, last = int(index[0]), int(index[-1])
    if last - first + 1 == index.numel():
        return x.narrow(dim, first, index.numel())
    return x.index_select(dim, index)


def _positions(positions: Sequence[int] | Tensor, device) -> Tensor:
    """Sorted, de-duplicated absolute positions as a long tensor (a set: no double counting)."""
    values = positions if isinstance(positions, Tensor) else torch.as_tensor(list(positions), device="cpu")
    if values.numel() and (values.is_floating_point() or values.dtype == torch.bool):
        raise LensprobeError(f"positions must be integers, got a {values.dtype} tensor.")
    return torch.unique(values.to(device=device, dtype=torch.long).flatten())


def _in_class(token: str, rule: str | Callable[[str], bool]) -> bool:
    if callable(rule):
        return bool(token) and bool(rule(token))
    core = token.strip()
    return bool(core) and set(core) <= set(rule)


def token_class_mask(str_tokens: Sequence[str],
                     classes: Mapping[str, str | Callable[[str], bool]] | None = None,
                     ) -> Float[Tensor, "n_class key_pos"]:
    """``[class, pos]`` 0/1 mask: which tokens belong to which class.

    A string rule (e.g. ``"#"``) takes tokens whose non-whitespace characters all come
    from that string (``"#"``, ``" ##"``); a callable rule takes the token string.
    """
    classes = DEFAULT_TOKEN_CLASSES if classes is None else classes
    return torch.tensor([[float(_in_class(t, rule)) for t in str_tokens] for rule in classes.values()], device="cpu")


def attention_by_token_class(pattern: Float[Tensor, "... head query_pos key_pos"] | Mapping[int, Tensor],
                             str_tokens: Sequence[str],
                             classes: Mapping[str, str | Callable[[str], bool]] | None = None,
                             ) -> Float[Tensor, "... n_class"]:
    """Attention mass onto each class of key tokens, averaged over queries and heads.

    For each query ``i`` and head: the sum of ``A[i, j]`` over keys ``j`` of the class;
    then the mean over all query positions and heads. So each value is the share of an
    average query's attention that lands on that class (classes need not cover every
    token, so the values sum to at most 1).

    Args:
        pattern: ``[head, q, k]`` for one layer, ``[layer, head, q, k]`` for several, or a
            ``{layer: [head, q, k]}`` dict (stacked in ascending layer order).
        str_tokens: the key tokens' strings (``Prompt.str_tokens``).
        classes: name -> rule; default :data:`DEFAULT_TOKEN_CLASSES` (``#``, ``*``,
            whitespace).

    Returns:
        ``[class]`` or ``[layer, class]``, in the order of ``classes``.

    Example:
        >>> A = torch.tensor([[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]])  # one head
        >>> attention_by_token_class(A, ["#", " ", "*"])  # hash, star, whitespace
        tensor([0.5667, 0.1667, 0.2667])
    """
    if isinstance(pattern, Mapping):
        pattern = torch.stack([pattern[layer] for layer in sorted(pattern)])
    _check_pattern(pattern)
    if pattern.ndim < 3:
        raise LensprobeError(
            f"pattern must be [head, query_pos, key_pos] or [layer, head, query_pos, key_pos], got shape "
            f"{tuple(pattern.shape)}; add a head dimension with pattern[None]."
        )
    if pattern.shape[-1] != len(str_tokens):
        raise LensprobeError(
            f"pattern has {pattern.shape[-1]} key positions but {len(str_tokens)} tokens were given."
        )
    mask = token_class_mask(str_tokens, classes).to(pattern.device, pattern.dtype)  # [c, k]
    finite = torch.isfinite(pattern)
    if bool(finite.all()):
        return torch.einsum("...qk,ck->...qc", pattern, mask).mean(dim=(-2, -3))
    # A class reads only its own keys: a non-finite entry makes NaN the classes holding its key.
    per_query = torch.einsum("...qk,ck->...qc", pattern.where(finite, 0.0), mask)
    read_bad = torch.einsum("...qk,ck->...qc", (~finite).to(pattern.dtype), mask) > 0
    return per_query.masked_fill(read_bad, torch.nan).mean(dim=(-2, -3))


def nonfinite_rows(logits: Float[Tensor, "... d_vocab"]) -> Tensor:
    """``[...]`` bool: rows of logits that give no distribution (a NaN or ``+inf``, or all ``-inf``).

    Example:
        >>> nonfinite_rows(torch.tensor([[0.0, float("-inf")], [float("nan"), 0.0]]))
        tensor([False,  True])
    """
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)


def entropy(logits: Float[Tensor, "... d_vocab"] | Sequence[float]) -> Float[Tensor, "..."]:
    """Entropy ``-sum p ln p`` of the next-token distribution, in nats.

    Args:
        logits: ``[..., d_vocab]`` logits (a tensor; a list or array of numbers is converted).
            ``-inf`` entries are tokens of probability 0.

    Returns:
        ``[...]`` entropies; ``NaN`` for each row holding a NaN or ``+inf``, or only ``-inf``
        (see the module docstring).

    Raises:
        LensprobeError: input that is not numbers, a 0-d tensor, or an empty vocabulary axis.

    Example:
        >>> entropy(torch.zeros(4))  # uniform over 4 tokens
        tensor(1.3863)
        >>> entropy(torch.tensor([0.0, float("nan")]))
        tensor(nan)
    """
    if not isinstance(logits, Tensor):
        try:
            logits = torch.as_tensor(logits)
        except (TypeError, ValueError, RuntimeError) as err:
            raise LensprobeError(
                f"entropy needs logits as a tensor [..., d_vocab] (or a list of numbers), got "
                f"{type(logits).__name__}: {err}"
            ) from None
    if logits.ndim == 0:
        raise LensprobeError(
            "entropy needs logits with a vocabulary axis [..., d_vocab], got a 0-d tensor; "
            "pass a row of logits, e.g. logits[0, -1]."
        )
    if logits.shape[-1] == 0:
        raise LensprobeError(
            f"entropy got logits of shape {tuple(logits.shape)}: the vocabulary axis (last) is empty."
        )
    if logits.dtype == torch.bool or logits.is_complex():
        raise LensprobeError(f"entropy needs real-valued logits, got a {logits.dtype} tensor.")
    if logits.dtype != torch.float64:
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    ent = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return ent.masked_fill(nonfinite_rows(logits), torch.nan)
