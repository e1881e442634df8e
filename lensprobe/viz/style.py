"""One style for every figure: condition labels and colours, token-class and trace colours, shared
layout helpers.

Figures in :mod:`lensprobe.viz` take their colours and labels from here. Conditions are
named as in :mod:`lensprobe.core.prompts.conditions` (``"w/o"``, ``"w/ Mless"``, ``"w/ Mful"``,
``"random sentence"``, or a user-defined name); :func:`condition_label` and
:func:`condition_colors` also accept the older spellings (``"none"``, ``"meaningless"``, ...).
"""

from collections.abc import Iterable

from lensprobe.core.prompts.conditions import canonical_condition_name

__all__ = ["ABLATED_COLOR", "CLASS_COLORS", "CLEAN_COLOR", "CONDITION_COLORS", "CONDITION_LABELS", "GENERATED_COLOR",
           "INDEX_NOTE", "LENS_COLORS", "LENS_LABELS", "NEAR_ZERO_COLOR", "PALETTE", "SPAN_COLOR", "TRACE_COLORS", "cell_labels", "color", "condition_colors",
           "condition_label", "filler_span", "header", "rgba", "same_condition", "table_of", "table_spelling", "unique",
           "vspacing"]

INDEX_NOTE = "0-based indices (TransformerLens): L0H13 = the papers' layer 1, head 14"


CONDITION_LABELS = {
    "w/o": "w/o filler",
    "w/ Mless": "Mless",
    "w/ Mful": "Mful",
    "random sentence": "random sentence",
}
"""Short legend labels of the built-in conditions; other conditions are labelled by their name."""


CONDITION_COLORS = {
    "w/o": "#222222",
    "w/ Mless": "#d62728",
    "w/ Mful": "#1f77b4",
    "random sentence": "#2ca02c",
}
"""Colours of the built-in conditions; other conditions take :data:`PALETTE` colours in order."""


CLASS_COLORS = {
    "# (hash)": "#1f77b4",
    "* (star)": "#ff7f0e",
    "whitespace": "#2ca02c",
    "other": "#c7c7c7",
}


PALETTE = ["#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f"]
"""Colours for keys without a colour of their own, in order."""


SPAN_COLOR = "#ffbf00"
"""Shading of the filler span."""


NEAR_ZERO_COLOR = "#7f7f7f"
"""Shading of the near-zero band of MLP activation histograms."""


def condition_label(name: str) -> str:
    """Legend label of a condition: ``"w/ Mless"`` (or ``"meaningless"``) -> ``"Mless"``; other names as given."""
    return CONDITION_LABELS.get(canonical_condition_name(name), str(name))


def same_condition(a: str, b: str) -> bool:
    """Whether two spellings name the same condition (``"none"`` and ``"w/o"`` do)."""
    return canonical_condition_name(a) == canonical_condition_name(b)


def table_spelling(name: str, present) -> str:
    """How the table writes condition ``name`` (any spelling): the entry of ``present`` naming the
    same condition, else ``name`` itself."""
    return next((p for p in present if same_condition(p, name)), name)


def condition_colors(names: Iterable[str]) -> dict[str, str]:
    """A colour per condition name: the built-in conditions' own, :data:`PALETTE` in order for the rest."""
    out: dict[str, str] = {}
    extra = 0
    for name in names:
        if name in out:
            continue
        own = CONDITION_COLORS.get(canonical_condition_name(name))
        if own is None:
            own, extra = PALETTE[extra % len(PALETTE)], extra + 1
        out[name] = own
    return out


def table_of(result):
    """The ``table`` of a result dataclass, or the DataFrame itself."""
    return getattr(result, "table", result)


def color(key: str, table: dict[str, str], i: int) -> str:
    """``table[key]``, else the ``i``-th :data:`PALETTE` colour."""
    return table.get(key, PALETTE[i % len(PALETTE)])


def unique(values) -> list:
    """The distinct values in first-seen order."""
    return list(dict.fromkeys(values))


def filler_span(rows) -> tuple[int, int] | None:
    """Half-open ``(start, end)`` positions of the rows whose segment is ``filler`` (``None`` if none)."""
    pos = rows.loc[rows["segment"] == "filler", "position"]
    return (int(pos.min()), int(pos.max()) + 1) if len(pos) else None


def header(text: str, height: float, legend_title: str = "") -> dict:
    """Title at the top, a horizontal legend under it on the left (clear of the plot's toolbar)."""
    return dict(
        title=dict(text=text, y=1 - 12 / height, yanchor="top", yref="container", x=0, xref="paper"),
        legend=dict(orientation="h", yref="container", y=1 - 64 / height, yanchor="top", xref="paper", x=0,
                    xanchor="left", title_text=legend_title),
    )


def wrap_note(note: str, width_px: float, char_px: float = 6.0) -> list[str]:
    """``note`` (a title's small second line) cut at spaces into lines that fit ``width_px``."""
    limit = max(20, int(width_px / char_px))
    lines: list[str] = []
    for word in note.replace(" ", " \x00").split("\x00"):
        if lines and len(lines[-1]) + len(word) <= limit:
            lines[-1] += word
        else:
            lines.append(word)
    return [line.strip() for line in lines]


def cell_labels(result, rows, cols, unit: str, missing: str) -> list[list[str]]:
    """Hover labels of a ``[layer, head]`` grid (``L0H3``): a cell the result has no value for says ``missing``
    and a measured cell whose value is NaN says so (read from ``result.measured()`` when it has one)."""
    measured = result.measured() if callable(getattr(result, "measured", None)) else None
    grid = result.grid() if measured is not None else None

    def label(lay: int, h: int) -> str:
        if measured is None or grid is None:
            return f"L{lay}{unit}{h}"
        if not bool(measured[lay, h]):
            return f"L{lay}{unit}{h} ({missing})"
        return f"L{lay}{unit}{h} (NaN)" if grid[lay, h] != grid[lay, h] else f"L{lay}{unit}{h}"

    return [[label(int(lay), int(h)) for h in cols] for lay in rows]


def grid_layout(title: str, note: str, n_rows: int, n_cols: int) -> dict:
    """Layout of a layer x head heatmap sized to its content: 18 px per row, 40 px per column, wide enough
    for its title, and a top margin that holds its note however many lines it wraps to.

    Example:
        >>> fig.update_layout(**grid_layout("Change in entropy", INDEX_NOTE, n_layers, n_heads))
    """
    width = max(480, 220 + 40 * n_cols, 8 * len(title) + 110)
    lines = wrap_note(note, width - 110)
    top = 70 + 15 * len(lines)
    return dict(title=dict(text=f"{title}<br><sup>{'<br>'.join(lines)}</sup>"), width=width,
                height=max(360, 120 + 18 * n_rows) + top - 100, margin=dict(t=top, l=80, r=30, b=60))


def vspacing(rows: int, gap_px: float, height: float) -> float:
    """Vertical subplot spacing that leaves ``gap_px`` pixels between ``rows`` rows."""
    return 0.0 if rows <= 1 else min(gap_px / height, 1.0 / (rows - 1))


GENERATED_COLOR = "#9ecae1"
"""Shading of generated tokens."""


TRACE_COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
"""Line colours of generation-trace settings, in order."""


CLEAN_COLOR = "#222222"
"""Bars of a run without intervention."""


ABLATED_COLOR = "#d62728"
"""Bars of a run with an intervention."""


def rgba(hex_color: str, alpha: float) -> str:
    """``"#d62728"``, 0.2 -> ``"rgba(214,39,40,0.2)"``."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


LENS_COLORS = {"entropy": "Viridis", "rank": "Magma_r", "kl": "Cividis"}
"""Colour scales of the logit-lens heatmap, by what it colours (:func:`lensprobe.viz.lens.logit_lens`)."""


LENS_LABELS = {"entropy": "entropy (nats)", "rank": "chosen token's rank", "kl": "KL (nats)"}
"""Colour-bar titles of the logit-lens heatmap, by what it colours."""
