"""The logit-lens figure: what each layer would predict at each step of a generation.

:func:`logit_lens` draws a trace's :class:`~lensprobe.generation.traces.lens.LensTrace` (``lp.generate(...,
lens="logit")``) for one row as a layer x step heatmap, coloured by the layer's entropy, the chosen token's
rank or the KL divergence from the model's distribution; the hover names the layer's top token, its
probability and the chosen token's rank and probability. Nothing is computed here, nothing is shown.
"""

import html
import math
from typing import Any

import plotly.graph_objects as go

from lensprobe.core.errors import LensprobeError
from lensprobe.viz.fit import fit_figure
from lensprobe.viz.style import LENS_COLORS, LENS_LABELS, grid_layout

__all__ = ["logit_lens"]

COLORS = tuple(LENS_COLORS)
"""What the heatmap can colour: ``"entropy"``, ``"rank"`` (log scale) or ``"kl"``."""
TEXT_CELLS = 600
"""Up to this many cells, each cell also shows its top token's text."""


def logit_lens(trace, row: int = 0, *, color: str = "entropy", title: str | None = None):
    """Heatmap of the logit lens of one row: layer x step, the top token's text on hover.

    Args:
        trace: a :class:`~lensprobe.generation.GenerationTrace` made with ``lens=`` (``lp.generate(...,
            lens="logit")``).
        row: the trace row to draw (a prompt, or one sample of it).
        color: ``"entropy"`` (nats, default), ``"rank"`` (the chosen token's rank under the layer's
            distribution, 0 = its top token; coloured on a log scale, ``log10(1 + rank)``) or ``"kl"``
            (KL(model || layer), nats).
        title: figure title (default names the row and what the colour shows).

    Returns:
        A plotly ``Figure`` holding one ``Heatmap``: ``z`` is ``[layer, step]`` (the steps the row ran), ``x``
        the steps (0 = last prompt position), ``y`` the layers, ``customdata[layer][step]`` = (top token,
        its probability, chosen token, its rank, its probability, entropy, KL).

    Raises:
        LensprobeError: a trace without a lens, a row out of range, or an unknown ``color``.

    Example:
        >>> out = lp.generate(model, prompt, max_new_tokens=32, lens="logit")
        >>> lp.viz.logit_lens(out, color="rank").write_html("lens.html")
    """
    lens = getattr(trace, "lens", None)
    if lens is None or not hasattr(lens, "entropy_rows"):
        raise LensprobeError("this trace has no logit lens: generate it with lens='logit' "
                             "(lp.generate(model, prompt, max_new_tokens=..., lens='logit')).")
    n_rows = int(lens.entropy_rows.shape[0])
    if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < n_rows:
        raise LensprobeError(f"row must be a row of the trace (0-{n_rows - 1}), got {row!r}.")
    if color not in COLORS:
        raise LensprobeError(f"color must be one of {list(COLORS)}, got {color!r}.")
    n = int(lens.recorded_rows[row].sum())
    layers = [int(x) for x in lens.layers]
    chosen = list(trace.str_tokens_rows[row][:n]) + [""] * (n - len(trace.str_tokens_rows[row][:n]))
    entropy, kl = lens.entropy_rows[row, :n].T.tolist(), lens.kl_rows[row, :n].T.tolist()
    rank, prob = lens.chosen_rank_rows[row, :n].T.tolist(), lens.chosen_prob_rows[row, :n].T.tolist()
    top, top_p = lens.top_ids_rows[row, :n, :, 0].T.tolist(), lens.top_probs_rows[row, :n, :, 0].T.tolist()
    chosen = [_shown(tok) for tok in chosen]
    text = [[_shown(lens.token_text.get(i, "")) for i in ids] for ids in top]
    custom = [[[text[i][t], top_p[i][t], chosen[t], rank[i][t], prob[i][t], entropy[i][t], kl[i][t]]
               for t in range(n)] for i in range(len(layers))]
    z = {"entropy": entropy, "kl": kl, "rank": [[math.log10(1 + r) if r >= 0 else None for r in ranks]
                                                for ranks in rank]}[color]
    bar: dict[str, Any] = {"title": {"text": LENS_LABELS[color]}}
    if color == "rank":
        top_rank = max((r for ranks in rank for r in ranks), default=0)
        ticks = sorted({v for v in (0, 1, 10, 100, 1_000, 10_000, 100_000) if v < top_rank} | {top_rank})
        bar.update(tickvals=[math.log10(1 + v) for v in ticks], ticktext=[str(v) for v in ticks])
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(n)), y=layers, customdata=custom, colorscale=LENS_COLORS[color], colorbar=bar,
        text=text if n * len(layers) <= TEXT_CELLS else None,
        texttemplate="%{text}" if n * len(layers) <= TEXT_CELLS else None, textfont=dict(size=9),
        hovertemplate="layer %{y}, step %{x}<br>top token %{customdata[0]} (p=%{customdata[1]:.3g})"
                      "<br>chosen %{customdata[2]}: rank %{customdata[3]}, p=%{customdata[4]:.3g}"
                      "<br>entropy %{customdata[5]:.3f} nats, KL %{customdata[6]:.3g}<extra></extra>"))
    what = {"entropy": "each layer's entropy", "rank": "the chosen token's rank per layer",
            "kl": "KL(model || layer) per layer"}[color]
    note = f"layers 0-based (TransformerLens); step 0 = the last prompt position; lens: {lens.lens}"
    layout = grid_layout(title or f"Logit lens of row {row}: {what}", note, len(layers), 0)
    layout["width"] = max(layout["width"], min(1600, 200 + 14 * n))
    fig.update_layout(**layout, template="plotly_white",
                      xaxis=dict(title_text="generation step (0 = last prompt position)"),
                      yaxis=dict(title_text="layer (0-based)", dtick=1 if len(layers) <= 32 else None))
    return fit_figure(fig)


def _shown(token: str) -> str:
    """A token as the figure shows it: escapes visible (``\\n``), HTML escaped, ``(empty)`` for nothing."""
    return html.escape(repr(token)[1:-1]) or "(empty)"
