"""A self-contained HTML report: sections of figures, HTML views and the numbers behind them.

``write_report(out_dir, sections)`` writes ``out_dir/index.html`` (viewable offline:
plotly's JavaScript is inlined once, circuitsvis views carry their own) and, per section,
a folder ``out_dir/<slug>/`` with every table as CSV and every data entry as JSON, linked
from the page. ``out_dir/report.json`` lists the sections and their files.

Example:
    >>> from lensprobe.viz.report import Section, write_report
    >>> sec = Section("My study", intro="<p>What it shows.</p>", figures=[fig],
    ...               tables={"numbers": df}, data={"model": "SmolLM2"})
    >>> write_report("lensprobe-report", [sec])
    PosixPath('lensprobe-report/index.html')
"""

import datetime as _dt
import functools
import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import plotly
from plotly.offline import get_plotlyjs

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.files import read_text
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.writer import OutputFolder
from lensprobe.core.version import __version__
from lensprobe.viz.embed import figure_div

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Section", "check_report_listing", "inert_scripts", "slugify", "write_report"]


@dataclass
class Section:
    """One section of the report.

    Attributes:
        title: heading (plain text; escaped).
        intro: HTML paragraphs shown under the heading (escape user text with ``html.escape``).
        figures: plotly figures.
        html: extra self-contained HTML blocks (e.g. a circuitsvis ``.local_src``).
        tables: name -> DataFrame, written as ``<slug>/<name>.csv``.
        data: name -> JSON-able value, written as ``<slug>/<name>.json``.
    """

    title: str
    intro: str = ""
    figures: list = field(default_factory=list)
    html: list[str] = field(default_factory=list)
    tables: dict[str, "pd.DataFrame"] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


def slugify(text: str) -> str:
    """A file-system-safe slug: ``"Filler vs random (L0H3)" -> "filler-vs-random-l0h3"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) > 60:
        slug = slug[:61].rsplit("-", 1)[0]
    return slug or "section"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{margin:0 0 8px;font-size:1.8em} h2{margin-top:48px;border-bottom:1px solid #ddd;padding-bottom:6px}
.meta{color:#444;font-size:.95em} .meta dt{font-weight:600;float:left;clear:left;width:170px}
.meta dd{margin:0 0 4px 180px} .note{background:#fff8e1;border-left:4px solid #ffbf00;padding:8px 12px}
nav ol{columns:2} .files{font-size:.9em;color:#555} .files a{margin-right:12px}
figure{margin:16px 0} figcaption{font-size:.9em;color:#444;margin-bottom:6px}
pre{background:#f4f4f4;padding:8px;overflow-x:auto;white-space:pre-wrap}
.lp-figure{margin:12px 0}
"""


_FIGURE_FILE = re.compile(r"figure-\d+\.json")

_SAVE_SCRIPT = """function lpImage(id, format) {
  var gd = document.getElementById(id);
  Plotly.downloadImage(gd, {format: format, filename: id, scale: format === "png" ? 2 : 1,
                            width: gd._fullLayout.width, height: gd._fullLayout.height});
  return false;
}"""

_INLINE_SCRIPT = re.compile(r"(<script\b[^>]*>)(.*?)(</script)", re.S | re.I)


def inert_scripts(block: str) -> str:
    """``block`` with ``<!--`` inside every inline script written as ``\\x3C!--``.

    A browser reads ``<!--`` followed by ``<script`` inside a script (e.g. in a token list a view
    embeds as JSON) as the start of an escaped section, which then swallows the script's own
    end tag and the page after it. In JavaScript strings ``\\x3C!--`` is the same text. (A ``</``
    inside embedded data must be escaped where the block is made: it would end the script.)

    Example:
        >>> inert_scripts('<script>var t = ["<!--", "<script"];</script>')
        '<script>var t = ["\\x3C!--", "<script"];</script>'
    """
    return _INLINE_SCRIPT.sub(lambda m: m.group(1) + m.group(2).replace("<!--", "\\x3C!--") + m.group(3), block)


def _figure_html(fig, div_id: str, json_file: str) -> str:
    """A figure at its own size, and under it its PNG and SVG (drawn by plotly in the reader's browser, with
    plotly's own ``downloadImage``) and its JSON, from which :func:`lensprobe.viz.save` writes a PDF."""
    name = html.escape(json_file.rsplit("/", 1)[1].removesuffix(".json"))
    links = " ".join(f'<a href="#{div_id}" onclick="return lpImage(\'{div_id}\', \'{fmt}\')">{fmt.upper()}</a>'
                     for fmt in ("png", "svg"))
    pdf = f'lp.viz.save(plotly.io.read_json("{html.escape(json_file)}"), "{name}.pdf")'
    return (f'<div class="lp-figure">{inert_scripts(figure_div(fig, div_id=div_id))}'
            f'<p class="files">This figure: {links} <a href="{html.escape(json_file)}">JSON</a> (PDF: <code>{pdf}</code>)</p></div>')


def _listed_files(out: OutputFolder) -> list[tuple[str, list[str]]]:
    """The sections and files an earlier report listed in ``report.json`` (none when it is unreadable)."""
    try:
        old = parse_json(read_text(out.root / "report.json", "report listing"), "report listing")
        return [(str(sec["slug"]), [str(rel) for rel in sec["files"]]) for sec in old["sections"]]
    except (LensprobeError, OSError, ValueError, KeyError, TypeError):
        return []


def check_report_listing(out_dir: str | Path) -> list[tuple[str, list[str]]]:
    """The sections and files the report in ``out_dir`` lists in its ``report.json``, every path checked to
    be inside the folder (:meth:`~lensprobe.core.storage.writer.OutputFolder.path`; a command calls it before
    its work, so a listing it would refuse costs nothing).

    Raises:
        LensprobeError: the listing names a path outside the folder (``..``, an absolute path, a section
            folder that is a link leading out); nothing is deleted.

    Example:
        >>> check_report_listing("lensprobe-report")[0][0]
        'attention-to-filler-tokens'
    """
    out = OutputFolder(out_dir, what="report folder")
    entries = _listed_files(out)
    try:
        for slug, files in entries:
            out.check_all([slug, *files])
    except LensprobeError as err:
        raise LensprobeError(f"{out.root / 'report.json'} lists a file outside the report folder ({err}) "
                             "Nothing was deleted: delete report.json (or write the report to a new folder) "
                             "and rerun.") from None
    return entries


def _remove_previous(out: OutputFolder) -> None:
    """Delete the files an earlier report listed in ``report.json`` (and nothing else), every listed path
    checked first (:func:`check_report_listing`)."""
    for slug, files in check_report_listing(out.root):
        for rel in files:
            if PurePosixPath(rel).parent.as_posix() == slug:
                out.remove(rel)
        out.remove_empty_dir(slug)


def _write_csv(df, tmp: Path) -> None:
    df.to_csv(tmp, index=False)


def _unique_slugs(sections: Sequence[Section]) -> list[str]:
    """One file-system-safe slug per section, numbered where titles repeat."""
    slugs: list[str] = []
    for sec in sections:
        if not isinstance(sec, Section):
            raise LensprobeError(f"write_report takes Section objects, got {type(sec).__name__}.")
        base = slug = slugify(sec.title)
        n = 2
        while slug in slugs:
            slug, n = f"{base}-{n}", n + 1
        slugs.append(slug)
    return slugs


def _number_files(sections: Sequence[Section], slugs: list[str]) -> list[list[str]]:
    """Every section's files (relative paths), checked before anything is written or deleted: two outputs
    whose names give one file are refused while nothing has changed on disk."""
    planned = [[f"{slug}/figure-{i}.json" for i in range(1, len(sec.figures) + 1)]
               + [f"{slug}/{slugify(name)}.csv" for name in sec.tables]
               + [f"{slug}/{slugify(name)}.json" for name in sec.data]
               for sec, slug in zip(sections, slugs, strict=True)]
    seen: dict[str, str] = {}
    for sec, files in zip(sections, planned, strict=True):
        for rel in files:
            if rel in seen:
                raise LensprobeError(f"section {sec.title!r} has two outputs named {rel} (names that give one file "
                                     "name, e.g. 'a b' and 'a-b'): the second would overwrite the first; give them "
                                     "different names. Nothing was written.")
            seen[rel] = sec.title
    return planned


def _write_numbers(out: OutputFolder, sec: Section, slug: str) -> list[str]:
    """Write a section's tables (CSV), data (JSON) and figures (plotly JSON) into ``out/slug``; return their
    relative paths. Two of them whose names give one file are refused (neither overwrites the other)."""
    files: list[str] = []
    for i, fig in enumerate(sec.figures, start=1):
        rel = f"{slug}/figure-{i}.json"
        out.write_text(rel, fig.to_json())
        files.append(rel)
    for name, df in sec.tables.items():
        rel = f"{slug}/{slugify(name)}.csv"
        out.write_with(rel, functools.partial(_write_csv, df))
        files.append(rel)
    for name, value in sec.data.items():
        rel = f"{slug}/{slugify(name)}.json"
        text = json.dumps(to_jsonable(value), separators=(",", ":"), allow_nan=False)
        if len(text) < 200_000:  # small files indented for reading, large ones compact
            text = json.dumps(json.loads(text), indent=1)
        out.write_text(rel, text)
        files.append(rel)
    return files


def _section_html(sec: Section, slug: str, files: list[str]) -> str:
    """One section's HTML: heading, intro, figures, HTML blocks and links to its files."""
    parts = [f'<section id="{slug}"><h2>{html.escape(sec.title)}</h2>', sec.intro]
    parts += [_figure_html(fig, f"{slug}-figure-{i}", f"{slug}/figure-{i}.json")
              for i, fig in enumerate(sec.figures, start=1)]
    parts += [f'<div class="lp-html">{inert_scripts(block)}</div>' for block in sec.html]
    files = [f for f in files if not _FIGURE_FILE.fullmatch(f.split("/", 1)[1])]  # linked under their figure
    if files:
        links = " ".join(f'<a href="{html.escape(f)}">{html.escape(f.split("/", 1)[1])}</a>' for f in files)
        parts.append(f'<p class="files">Numbers behind this section: {links}</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _page(title: str, facts: Mapping[str, Any], toc: str, body: str) -> str:
    """The whole page: plotly's JavaScript inline once, the facts, the table of contents, the sections."""
    dl = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
<script type="text/javascript">{_SAVE_SCRIPT}</script>
</head><body><main>
<h1>{html.escape(title)}</h1>
<dl class="meta">{dl}</dl>
<p class="note">Layer and head indices are 0-based, as in TransformerLens: <b>L0H13</b> is layer 0, head 13,
which the papers call "layer 1, head 14". Every figure's numbers are saved next to this page as CSV/JSON;
under each figure, its PNG and SVG (drawn in this browser) and its plotly JSON (for a PDF, with
<code>lp.viz.save</code>).</p>
<nav><ol>{toc}</ol></nav>
{body}
</main></body></html>
"""


def write_report(out_dir: str | Path, sections: Sequence[Section] | Section, *, title: str = "lensprobe report",
                 meta: Mapping[str, str] | None = None) -> Path:
    """Write the report and the numbers behind it; return the path of ``index.html``.

    Args:
        out_dir: folder to write into (created if needed; files of the same names are
            overwritten, nothing else is touched).
        sections: the report's sections, in order.
        title: page title.
        meta: extra facts shown at the top (e.g. ``{"model": "SmolLM2-135M-Instruct"}``).

    Returns:
        ``out_dir / "index.html"``.

    Example:
        >>> write_report("lensprobe-report", [Section("My study", figures=[fig], tables={"numbers": df})])
        PosixPath('lensprobe-report/index.html')
    """
    if isinstance(sections, Section):
        sections = [sections]
    slugs = _unique_slugs(sections)
    _number_files(sections, slugs)
    out = OutputFolder(out_dir, what="report folder")
    _remove_previous(out)
    manifest: list[dict[str, Any]] = []
    body: list[str] = []
    for sec, slug in zip(sections, slugs, strict=True):
        files = _write_numbers(out, sec, slug)
        manifest.append({"title": sec.title, "slug": slug, "files": files, "n_figures": len(sec.figures),
                         "n_html": len(sec.html)})
        body.append(_section_html(sec, slug, files))
    facts = {"generated": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "lensprobe": __version__,
             "plotly": plotly.__version__}
    facts.update(meta or {})
    toc = "".join(f'<li><a href="#{s}">{html.escape(sec.title)}</a></li>' for sec, s in zip(sections, slugs, strict=True))
    index = out.write_text("index.html", _page(title, facts, toc, "".join(body)))
    out.write_text("report.json",
                   json.dumps({"title": title, "meta": to_jsonable(facts), "sections": manifest}, indent=1))
    return index
