"""Saving figures: interactive HTML, the figure's JSON, or static PNG / SVG / PDF for papers.

Static images are drawn by plotly's own renderer through kaleido (installed with lensprobe), which
runs a Chrome or Chromium it finds on the machine (on ``PATH``, at the usual install places, one
downloaded with ``plotly_get_chrome``, or ``$BROWSER_PATH``). All the static files of one call are
drawn in one browser session.

Example:
    >>> lp.viz.save(fig, "sweep.pdf")
    PosixPath('sweep.pdf')
    >>> lp.viz.save(fig, "sweep.png", "sweep.svg", scale=3)   # one browser start for both
"""

import os
from pathlib import Path

from lensprobe.core.errors import LensprobeError

__all__ = ["STATIC_FORMATS", "browser_path", "save"]

STATIC_FORMATS = ("png", "svg", "pdf", "jpeg", "webp")
"""The static formats :func:`save` writes through kaleido (by the file's suffix; ``.jpg`` is JPEG)."""

NO_BROWSER = ("static export (PNG/SVG/PDF) needs Chrome or Chromium and none was found: install one "
              "(Debian/Ubuntu: `sudo apt-get install chromium`), download one for plotly with "
              "`plotly_get_chrome`, or set BROWSER_PATH to its executable.")


def browser_path() -> str | None:
    """The Chrome or Chromium kaleido would run for static export, ``None`` when there is none."""
    from choreographer.browsers.chromium import Chromium

    return Chromium.find_browser(skip_local=False)


def _format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    suffix = "jpeg" if suffix == "jpg" else suffix
    if suffix not in (*STATIC_FORMATS, "html", "json"):
        raise LensprobeError(f"cannot save a figure as {path.name!r}: use a file ending in .html, .json or "
                             f"one of {', '.join('.' + f for f in STATIC_FORMATS)}.")
    return suffix


def save(fig, *paths: str | os.PathLike, scale: float = 2, width: int | None = None,
         height: int | None = None) -> Path | list[Path]:
    """Write a plotly figure to files, each in the format its suffix names.

    Args:
        fig: a plotly figure (any of :mod:`lensprobe.viz`'s, or your own).
        paths: ``.pdf``, ``.svg``, ``.png``, ``.jpeg``/``.jpg``, ``.webp`` (static, through kaleido and a
            Chrome/Chromium), ``.html`` (interactive, plotly's JavaScript inline: opens offline) or
            ``.json`` (the figure itself: ``plotly.io.read_json`` reads it back).
        scale: pixel density of PNG, JPEG and WebP (2: sharp on a high-density screen or in print).
        width: width in pixels (default: the figure's own, else 700).
        height: height in pixels (default: the figure's own, which lensprobe's figures size to their
            content).

    Returns:
        The path written (one path given), or the list of paths.

    Raises:
        LensprobeError: an unknown suffix, no path, or (static formats) no Chrome or Chromium to draw with.

    Example:
        >>> lp.viz.save(lp.viz.sweep_heatmap(sweep), "sweep.pdf", "sweep.png")
        [PosixPath('sweep.pdf'), PosixPath('sweep.png')]
    """
    if not paths:
        raise LensprobeError("save(fig, path, ...) needs at least one path, e.g. 'figure.pdf'.")
    files = [Path(p).expanduser() for p in paths]
    formats = [_format(f) for f in files]
    static = [(f, fmt) for f, fmt in zip(files, formats, strict=True) if fmt in STATIC_FORMATS]
    for f, fmt in zip(files, formats, strict=True):
        f.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "html":
            fig.write_html(f, include_plotlyjs=True, full_html=True)
        elif fmt == "json":
            fig.write_json(f)
    if static:  # kaleido's batch call does not read the figure's own size: pass it
        _write_static(fig, static, scale=scale, width=width or fig.layout.width or 700,
                      height=height or fig.layout.height or 500)
    return files[0] if len(files) == 1 else files


def _write_static(fig, targets: list[tuple[Path, str]], **opts) -> None:
    """Draw ``fig`` into every ``(file, format)`` in one kaleido call (one browser session)."""
    import plotly.io as pio

    if browser_path() is None:
        raise LensprobeError(NO_BROWSER)
    n = len(targets)
    try:
        pio.write_images([fig] * n, [str(f) for f, _ in targets], format=[fmt for _, fmt in targets],
                         scale=[opts["scale"]] * n, width=[opts["width"]] * n, height=[opts["height"]] * n)
    except RuntimeError as err:  # kaleido found no browser after all, or the browser would not start
        raise LensprobeError(f"{NO_BROWSER} ({str(err).strip().splitlines()[0] if str(err).strip() else err})") from err
