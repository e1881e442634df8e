"""One style for every figure: colours per condition, token class and trace, labels, shared layout helpers.

Figures in :mod:`lensprobe.viz` take their colours and labels from here (condition names
and labels come from :mod:`lensprobe.core.conditions`).
"""

from lensprobe.core.conditions import CONDITION_LABELS

__all__ = ["CLASS_COLORS", "CONDITION_COLORS", "CONDITION_LABELS", "GENERATED_COLOR", "INDEX_NOTE", "PALETTE",
           "SPAN_COLOR", "TRACE_COLORS", "color", "filler_span", "header", "rgba", "table_of", "unique",
           "vspacing"]

INDEX_NOTE = "0-based indices (TransformerLens): L0H13 = the papers' layer 1, head 14"


CONDITION_COLORS = {
    "none": "#222222",
    "meaningless": "#d62728",
    "meaningful": "#1f77b4",
    "random": "#2ca02c",
}


CLASS_COLORS = {
    "# (hash)": "#1f77b4",
    "* (star)": "#ff7f0e",
    "whitespace": "#2ca02c",
    "other": "#c7c7c7",
}


PALETTE = ["#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]


SPAN_COLOR = "#ffbf00"


def table_of(result):
    return getattr(result, "table", result)


def color(key: str, table: dict[str, str], i: int) -> str:
    return table.get(key, PALETTE[i % len(PALETTE)])


def unique(values) -> list:
    return list(dict.fromkeys(values))


def filler_span(rows) -> tuple[int, int] | None:
    pos = rows.loc[rows["segment"] == "filler", "position"]
    return (int(pos.min()), int(pos.max()) + 1) if len(pos) else None


def header(text: str, height: float, legend_title: str = "") -> dict:
    """Title at the top, a horizontal legend under it on the left (clear of the plot's toolbar)."""
    return dict(
        title=dict(text=text, y=1 - 12 / height, yanchor="top", yref="container", x=0, xref="paper"),
        legend=dict(orientation="h", yref="container", y=1 - 64 / height, yanchor="top", xref="paper", x=0,
                    xanchor="left", title_text=legend_title),
    )


def vspacing(rows: int, gap_px: float, height: float) -> float:
    return 0.0 if rows <= 1 else min(gap_px / height, 1.0 / (rows - 1))


GENERATED_COLOR = "#9ecae1"


TRACE_COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"
