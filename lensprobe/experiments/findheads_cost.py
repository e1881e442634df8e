"""The settings of :func:`~lensprobe.experiments.findheads.find_heads`, checked, and what it costs in
forward-equivalents per prompt against the batched sweep of every head: the estimate it makes before any
forward to choose between the two.

Example:
    >>> sweep_cost([(0, 0), (0, 1)], n_layers=2, batch_size=8) > 0
    True
"""

from typing import Any

from lensprobe.core.checks import count, finite_number
from lensprobe.experiments.sweep import chunk_cost, layer_chunks

__all__ = ["ATP_COST", "FLAG_COST", "check_search_settings", "rows_cost", "search_plan", "sweep_cost"]

ATP_COST = 3.0
"""Forward-equivalents of one AtP pass on one prompt (a forward, and a backward at about two)."""
FLAG_COST = 1.0
"""Forward-equivalents of the flag pass on one prompt (one clean forward recording ``hook_z``)."""

def rows_cost(rows: list, n_layers: int, batch_size: int) -> float:
    """Forward-equivalents of ablating ``rows`` (``None``: the clean row) cut as the search cuts them."""
    return sum(chunk_cost(c, n_layers) for c in layer_chunks(rows, n_layers, batch_size)) if rows else 0.0


def sweep_cost(pairs: list, n_layers: int, batch_size: int) -> float:
    """Forward-equivalents per prompt of the batched sweep of every head (the clean row first, fixed batches)."""
    rows = [None, *pairs]
    return sum(chunk_cost(rows[i: i + batch_size], n_layers) for i in range(0, len(rows), batch_size))


def search_plan(pairs: list, n_layers: int, top: int, step: int, sample: int, flag: float, batch_size: int
          ) -> dict[str, float]:
    """The estimate made before any forward, per prompt: the least the search costs (AtP, the flag pass, the
    clean row and the ``top + step + sample`` heads the stopping rule needs at least, or every head with
    ``flag=0``, at the sweep's mean cost per row) and the sweep's cost."""
    sweep = sweep_cost(pairs, n_layers, batch_size)
    heads = len(pairs) if flag == 0 else min(len(pairs), top + step + sample)
    return {"search": ATP_COST + FLAG_COST + (1 + heads) * sweep / (1 + len(pairs)), "sweep": sweep}


def check_search_settings(top: Any, sample: Any, batch_size: Any, step: Any, budget: Any, flag: Any, refine: Any) -> None:
    """Refuse a setting of the search that is not a count (or a flag that is not a finite share or inf)."""
    for name, value, low in (("top", top, 1), ("sample", sample, 0), ("batch_size", batch_size, 1),
                             ("step", 1 if step is None else step, 1), ("budget", 0 if budget is None else budget, 0),
                             ("refine", refine, 0)):
        count(name, value, low)
    finite_number("flag", flag, 0, allow_inf=True)  # a share of the residual stream's norm; inf flags none
