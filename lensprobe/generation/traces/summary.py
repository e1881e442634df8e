"""A figure's data from generation traces: per condition and step, the mean and a band across rows.

:func:`trace_summary` reduces :class:`~lensprobe.generation.traces.trace.GenerationTrace` objects (one per
condition: a thinking setting, a filler) to a table of entropy and attention proportion per step, the
mean over the rows still generating at that step with a standard-deviation or 95 % band: what
:func:`lensprobe.viz.generation_trace_figure` draws.

Example:
    >>> df = lp.generation.trace_summary({"LatentFusion": t1, "Pause": t2}, band="std", smooth=5)
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.generation.traces.trace import GenerationTrace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Band", "trace_summary"]

Band = Literal["std", "ci95", "none"]


def trace_summary(traces: Mapping[str, GenerationTrace] | GenerationTrace, *, track: str | None = "thinking",
                  band: Band = "std", smooth: int = 1) -> "pd.DataFrame":
    """Mean and band across rows (samples or prompts) per step, per condition: the figure's data.

    For each condition and step: the entropy, and the attention proportion onto ``track``
    (mean over layers and heads), averaged over the rows that are still generating at that
    step. ``smooth > 1`` first applies a centred moving average of that many steps to each
    row's series.

    Args:
        traces: condition name -> trace (or one trace, named ``"trace"``).
        track: tracked set for the attention panel (``None``: entropy only). A condition
            whose trace lacks the set gets no attention rows.
        band: ``"std"`` (mean +- one standard deviation), ``"ci95"`` (mean +- 1.96 standard
            errors), or ``"none"``.
        smooth: moving-average window in steps (1 = none).

    Returns:
        Columns ``condition``, ``metric`` (``"entropy"`` or ``"attention"``), ``step``,
        ``mean``, ``lower``, ``upper``, ``n`` (rows averaged), plus ``set``.

    Example:
        >>> df = lp.generation.trace_summary({"LatentFusion": t1, "Pause": t2}, band="std", smooth=5)
        >>> fig = lp.viz.generation_trace_figure(df)
    """
    pd = pandas()
    if isinstance(traces, GenerationTrace):
        traces = {"trace": traces}
    if band not in ("std", "ci95", "none"):
        raise LensprobeError(f"band must be 'std', 'ci95' or 'none', got {band!r}.")
    if not isinstance(smooth, int) or smooth < 1:
        raise LensprobeError(f"smooth must be an integer window >= 1 (steps), got {smooth!r}.")
    frames = []
    for name, trace in traces.items():
        series = {"entropy": trace.entropy_rows.numpy()}
        if track is not None and track in trace.attention_rows:
            series["attention"] = torch.nanmean(trace.attention_rows[track], dim=(2, 3)).numpy()
        for metric, x in series.items():
            x = x.astype(float)
            if smooth > 1:
                x = pd.DataFrame(x.T).rolling(smooth, center=True, min_periods=1).mean().to_numpy().T.copy()
                x[np.isnan(trace.entropy_rows.numpy())] = np.nan  # keep stopped steps empty
            n = (~np.isnan(x)).sum(0)
            keep = n > 0
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.nanmean(np.where(keep, x, 0.0), 0) if x.size else np.zeros(0)
                std = np.nanstd(x, 0, ddof=1) if x.shape[0] > 1 else np.zeros(x.shape[1])
            std = np.nan_to_num(std)
            half = {"std": std, "ci95": 1.96 * std / np.sqrt(np.maximum(n, 1)), "none": np.zeros_like(std)}[band]
            steps = np.arange(x.shape[1])
            frames.append(pd.DataFrame({
                "condition": name, "metric": metric, "set": track if metric == "attention" else "",
                "step": steps[keep], "mean": mean[keep], "lower": (mean - half)[keep],
                "upper": (mean + half)[keep], "n": n[keep],
            }))
    cols = ["condition", "metric", "set", "step", "mean", "lower", "upper", "n"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
