"""Figures embedded in pages (the report, the docs site) at their own size.

Every lensprobe figure sets its height and width from its content (layers, rows, title lines:
:func:`lensprobe.viz.fit.fit_figure`). :func:`figure_div` keeps both (a column narrower than the figure scrolls
sideways rather than squeezing it, which would cut its titles; a figure without a width fills the column) and
keeps plotly's toolbar in a band of :data:`TOOLBAR_PX` pixels above the figure, where it covers no title.
:func:`frame_height` is the height a frame (an ``<iframe>``) needs to show the whole figure.

Example:
    >>> html = figure_div(lp.viz.sweep_heatmap(res))
    >>> frame_height(lp.viz.sweep_heatmap(res))    # the layout's height, the toolbar band, a scroll bar
    706
"""

import plotly.graph_objects as go

__all__ = ["SCROLLBAR_PX", "TOOLBAR_PX", "figure_div", "figure_page", "frame_height"]

TOOLBAR_PX = 30
"""The band above a figure that holds plotly's toolbar."""

DEFAULT_HEIGHT = 450
"""plotly's height of a figure that sets none."""

_CSS = (".lp-plot{position:relative;width:100%;box-sizing:border-box} "
        f".lp-plot .modebar-container{{top:-{TOOLBAR_PX}px !important}}")


SCROLLBAR_PX = 16
"""Room under a figure for the sideways scroll bar of a column narrower than the figure."""


def frame_height(fig) -> int:
    """The pixels a frame needs to show ``fig`` whole: its layout height, the toolbar band and, for a figure with a
    width of its own, room for a scroll bar."""
    return int(fig.layout.height or DEFAULT_HEIGHT) + TOOLBAR_PX + (SCROLLBAR_PX if fig.layout.width else 0)


def figure_div(fig, *, include_plotlyjs: bool | str = False, div_id: str | None = None) -> str:
    """``fig`` as an HTML block at its own height and width (in a block that scrolls sideways when its container is
    narrower), or as wide as its container when the figure sets no width.

    Args:
        fig: a plotly figure (not changed: a copy is embedded).
        include_plotlyjs: as plotly's ``to_html`` (``False``: the page loads plotly.js once itself).
        div_id: the id of the figure's element (default: a random one).
    """
    fig = go.Figure(fig)
    height, width = int(fig.layout.height or DEFAULT_HEIGHT), fig.layout.width
    fig.update_layout(height=height, width=None, autosize=True)
    div = fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs, default_width="100%",
                      default_height=f"{height}px", config={"displaylogo": False, "responsive": True},
                      div_id=div_id)
    limit = f"max-width:{int(width)}px;min-width:{int(width)}px;" if width else ""
    return (f'<div class="lp-frame" style="overflow-x:auto"><div class="lp-plot" data-height="{height}" '
            f'style="{limit}padding-top:{TOOLBAR_PX}px"><style>{_CSS}</style>{div}</div></div>')


def figure_page(fig, *, include_plotlyjs: bool | str = "directory") -> str:
    """A whole HTML page holding only ``fig`` (for an ``<iframe>`` of :func:`frame_height` pixels)."""
    return ('<!DOCTYPE html><html><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            "<style>html,body{margin:0;padding:0;overflow:hidden}</style></head><body>"
            f"{figure_div(fig, include_plotlyjs=include_plotlyjs)}</body></html>")
