"""What :func:`~lensprobe.studies.sinks.attention_sinks` computes inside the hooks, and the rows it makes of it.

Nothing of a forward is kept but these reductions (computed where the activation is, on every engine):

- :class:`TargetMass`: a layer's attention pattern ``[batch, head, query_pos, key_pos]`` -> per target
  (the first token, or a segment's key span) the attention mass each query puts on it, ``[batch,
  target, head, query_pos]``; the ``[query, key]`` matrix itself is never kept;
- :class:`PromptMassive`: a layer's residual stream over the whole prompt ``[batch, pos, d_model]`` -> its
  ``k`` largest ``|entries|`` (value, position, dimension) and the median ``|entry|``;
- :class:`MassiveEntries`: the same at a generation step's newest position ``[batch, d_model]``, the
  ``reduce`` of a :class:`~lensprobe.generation.traces.activations.Record`.

The median is ``torch.median``'s: the lower of the two middle values for an even count.

Example:
    >>> MassiveEntries(2)(torch.tensor([[1.0, -5.0, 2.0, 0.5]]))   # top |x|, their dims, values, median
    tensor([[ 5.,  2.,  1.,  2., -5.,  2.,  1.]])
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lensprobe.core.hooks.heads import head_label
from lensprobe.core.lazy import pandas

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FIRST", "MassiveEntries", "PromptMassive", "TargetMass", "massive_rows", "prompt_sink_rows",
           "step_massive_rows", "step_sink_rows"]

FIRST = "first token"
"""The target name of the prompt's first token (position 0), the attention sink."""


@dataclass(frozen=True)
class TargetMass:
    """Attention mass per target: ``spans`` are half-open key spans ``(start, end)``, in order.

    ``pattern [batch, head, query, key]`` -> ``[batch, target, head, query]``: each query's attention
    summed over the target's keys (only the span's columns are read).
    """

    spans: tuple[tuple[int, int], ...]

    def __call__(self, pattern: Tensor) -> Tensor:
        return torch.stack([pattern[..., a:b].float().sum(-1) for a, b in self.spans], dim=1).cpu()


@dataclass(frozen=True)
class PromptMassive:
    """The ``k`` largest ``|entries|`` of a residual stream over all prompt positions, and its median ``|entry|``.

    ``x [batch, pos, d_model]`` -> ``[batch, 4, k]`` float64: row 0 the magnitudes (largest first), row 1
    the flat index ``position * d_model + dimension``, row 2 the signed values, row 3 the median ``|entry|``
    (repeated).
    """

    k: int

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.reshape(x.shape[0], -1).double()
        mags = flat.abs()
        top = mags.topk(self.k, dim=-1)
        median = mags.median(dim=-1).values[:, None].expand(-1, self.k)
        return torch.stack([top.values, top.indices.double(), flat.gather(-1, top.indices), median], dim=1).cpu()


@dataclass(frozen=True)
class MassiveEntries:
    """The ``k`` largest ``|entries|`` of the newest position's residual stream, and its median ``|entry|``.

    ``x [batch, d_model]`` -> ``[batch, 3k + 1]``: the magnitudes (largest first), their dimensions, their
    signed values, then the median ``|entry|`` (a ``reduce`` of :class:`lensprobe.Record`).
    """

    k: int

    def __call__(self, x: Tensor) -> Tensor:
        mags = x.abs()
        top = mags.topk(self.k, dim=-1)
        median = mags.median(dim=-1).values[:, None]
        return torch.cat([top.values, top.indices.float(), x.gather(-1, top.indices), median], dim=-1)


def prompt_sink_rows(condition: str, masses: Mapping[int, Tensor], targets: Mapping[str, tuple[int, int]],
                     heads: Sequence[int]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """``(per head, per query)`` rows of one condition's prompt from its ``{layer: [target, head, query]}``
    masses: a target's queries are the positions from its end on (those that see all of it)."""
    pd = pandas()
    means: list[tuple] = []
    queries = []
    for layer, mass in masses.items():
        for t, (target, (_, end)) in enumerate(targets.items()):
            seen = mass[t, list(heads), end:].double()  # [head, query]
            n = int(seen.shape[-1])
            mean = seen.mean(-1).tolist() if n else [float("nan")] * len(heads)
            means.extend((condition, layer, h, head_label(layer, h), target, float(m), n)
                         for h, m in zip(heads, mean, strict=True))
            queries.append(pd.DataFrame({
                "condition": condition, "layer": layer, "head": [h for h in heads for _ in range(n)],
                "target": target, "query": list(range(end, end + n)) * len(heads),
                "mass": seen.reshape(-1).tolist()}))
    cols = ["condition", "layer", "head", "head_label", "target", "mass", "queries"]
    return pd.DataFrame(means, columns=cols), pd.concat(queries, ignore_index=True)


def massive_rows(condition: str, values: Mapping[int, Tensor], d_model: int, str_tokens: Sequence[str]
                 ) -> "pd.DataFrame":
    """Rows of the prompt's massive activations from ``{layer: [4, k]}`` (:class:`PromptMassive`)."""
    rows = []
    for layer, v in values.items():
        mags, flat, signed, median = (v[i].tolist() for i in range(4))
        for rank, (m, f, s, med) in enumerate(zip(mags, flat, signed, median, strict=True)):
            pos, dim = divmod(int(f), d_model)
            rows.append((condition, "prompt", None, pos, str_tokens[pos], layer, rank, dim, s, m, med,
                         m / med if med > 0 else float("inf")))
    out = pandas().DataFrame(rows, columns=MASSIVE_COLUMNS)
    out["step"] = out["step"].astype("Int64")
    return out


MASSIVE_COLUMNS = ["condition", "phase", "step", "position", "token", "layer", "rank", "dim", "value", "magnitude",
                   "median", "ratio"]
"""The columns of :attr:`~lensprobe.studies.sinks.AttentionSinks.massive`."""


def step_positions(trace: Any, prompt_len: int, prompt_tokens: Sequence[str]) -> tuple[list[int], list[str]]:
    """The absolute position and the token text at each step of a one-row trace (step ``t``: position
    ``prompt_len - 1 + t``, holding the last prompt token at step 0 and generated token ``t - 1`` after)."""
    generated = list(trace.str_tokens_rows[0]) if trace.str_tokens_rows else []
    n = trace.n_steps
    return [prompt_len - 1 + t for t in range(n)], [prompt_tokens[-1], *generated[: max(n - 1, 0)]]


def step_sink_rows(condition: str, trace: Any, targets: Sequence[str], positions: list[int], tokens: list[str]
                   ) -> "pd.DataFrame":
    """Rows of one condition's per-step masses from a one-row trace's ``attention_rows[target]``
    ``[row, step, layer, head]`` (steps, then layers, then heads, per target)."""
    pd = pandas()
    n_steps, layers, n_heads = trace.n_steps, list(trace.layers), trace.n_heads
    step = [s for s in range(n_steps) for _ in range(len(layers) * n_heads)]
    layer = [layer for _ in range(n_steps) for layer in layers for _ in range(n_heads)]
    head = list(range(n_heads)) * (n_steps * len(layers))
    labels = [head_label(a, h) for a, h in zip(layer, head, strict=True)]
    frames = [pd.DataFrame({
        "condition": condition, "step": step, "position": [positions[s] for s in step],
        "token": [tokens[s] for s in step], "layer": layer, "head": head, "head_label": labels, "target": target,
        "mass": trace.attention_rows[target][0, :n_steps].reshape(-1).tolist()}) for target in targets]
    return pd.concat(frames, ignore_index=True)


def step_massive_rows(condition: str, trace: Any, names: Mapping[int, str], k: int, positions: list[int],
                      tokens: list[str]) -> "pd.DataFrame":
    """Rows of one condition's per-step massive activations from the trace's recorded values
    (:class:`MassiveEntries`, ``[row, step, 3k + 1]``)."""
    rows = []
    for layer, name in names.items():
        v = trace.activations_rows[name][0, : trace.n_steps].double()
        for s in range(v.shape[0]):
            med = float(v[s, 3 * k])
            for rank in range(k):
                m = float(v[s, rank])
                rows.append((condition, "step", s, positions[s], tokens[s], layer, rank, int(v[s, k + rank]),
                             float(v[s, 2 * k + rank]), m, med, m / med if med > 0 else float("inf")))
    out = pandas().DataFrame(rows, columns=MASSIVE_COLUMNS)
    out["step"] = out["step"].astype("Int64")
    return out
