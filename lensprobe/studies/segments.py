"""The attention one prompt segment (the question, the system prompt, the filler) receives, per layer.

:func:`segment_attention` sums, over the segment's token positions, each position's average attention
received (the mean over later queries ``i > j`` of ``A[i, j]``) from an
:class:`~lensprobe.studies.filler.AttentionReceived` result, and summarises it over heads per condition
and layer: how much of a later token's attention goes to that segment, layer by layer, with and without
filler. :func:`lensprobe.viz.segment_attention_figure` draws it.

Example:
    >>> res = lp.studies.attention_received_by_condition(model, "What is 12+7?")   # every layer
    >>> lp.studies.segment_attention(res, "question")
"""

from typing import TYPE_CHECKING

from lensprobe.core.errors import LensprobeError

if TYPE_CHECKING:
    import pandas as pd

    from lensprobe.studies.filler import AttentionReceived

__all__ = ["segment_attention"]


def segment_attention(result: "AttentionReceived", segment: str = "question") -> "pd.DataFrame":
    """Attention received by ``segment``'s positions, per condition and layer (mean and spread over heads).

    Args:
        result: :func:`~lensprobe.studies.filler.attention_received_by_condition` (run it on several
            layers, e.g. ``layers=None`` for all).
        segment: a segment of the prompts (``"question"``, ``"system"``, ``"filler"``, ...).

    Returns:
        One row per (condition, layer): ``condition``, ``layer``, ``segment``, ``positions`` (the
        segment's length in tokens), ``attention`` (the sum over its positions of the average
        attention each receives, mean over the heads run), ``sd`` (its standard deviation over heads),
        ``heads``. A condition whose prompt has no such segment (the filler without filler) has no rows.

    Raises:
        LensprobeError: no prompt of ``result`` has the segment (the error lists those there are).

    Example:
        >>> segment_attention(res, "filler").query("condition == 'w/ Mless'")
    """
    table = result.table
    rows = table[table["segment"] == segment]
    if rows.empty:
        found = sorted({str(s) for s in table["segment"].dropna()})
        raise LensprobeError(f"no prompt of this result has a segment {segment!r}: use one of {found}.")
    per_head = (rows.groupby(["condition", "layer", "head"], sort=False)
                .agg(attention=("attention", "sum"), positions=("position", "size")).reset_index())
    out = (per_head.groupby(["condition", "layer"], sort=False)
           .agg(positions=("positions", "first"), attention=("attention", "mean"), sd=("attention", "std"),
                heads=("head", "size")).reset_index())
    out.insert(2, "segment", segment)
    return out.sort_values(["condition", "layer"], key=lambda c: c.map(_order(result)) if c.name == "condition"
                           else c, kind="stable").reset_index(drop=True)


def _order(result) -> dict[str, int]:
    return {c: i for i, c in enumerate(result.conditions)}
