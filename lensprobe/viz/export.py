"""Saving figures: interactive HTML, the figure's JSON, or static PNG / SVG / PDF for papers.

Static images are drawn by plotly's own renderer through kaleido (installed with lensprobe), which
runs a Chrome or Chromium it finds on the machine (on ``PATH``, at the usual install places, one
downloaded with ``plotly_get_chrome``, or ``$BROWSER_PATH``). All the static files of one call are
drawn in one browser session, in a child process given at most :func:`export_limit` seconds (60 unless
``$LENSPROBE_EXPORT_TIMEOUT`` says otherwise): a browser that never answers is stopped, with the browser
it started, and the error names the browser and the fix. Every file is written whole, through the one
writer (:func:`~lensprobe.core.storage.writer.atomic_file`).

Example:
    >>> lp.viz.save(fig, "sweep.pdf")
    PosixPath('sweep.pdf')
    >>> lp.viz.save(fig, "sweep.png", "sweep.svg", scale=3)   # one browser start for both
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lensprobe.core.checks import count, finite_number
from lensprobe.core.errors import LensprobeError
from lensprobe.core.given import seconds_from_env
from lensprobe.core.storage.locks import pid_alive
from lensprobe.core.storage.writer import atomic_file

__all__ = ["EXPORT_TIMEOUT", "EXPORT_TIMEOUT_VAR", "STATIC_FORMATS", "browser_path", "export_limit", "save"]

EXPORT_TIMEOUT = 60.0
"""Seconds a static export may take (browser start included) before it is stopped with an error."""
EXPORT_TIMEOUT_VAR = "LENSPROBE_EXPORT_TIMEOUT"
"""The environment variable that sets another limit than :data:`EXPORT_TIMEOUT` (seconds)."""
_CHILD = """import json, sys
import plotly.io as pio
job = json.loads(sys.stdin.read())
fig = pio.from_json(job.pop("figure"), skip_invalid=True)
n = len(job["files"])
pio.write_images([fig] * n, job["files"], format=job["formats"], scale=[job["scale"]] * n,
                 width=[job["width"]] * n, height=[job["height"]] * n)
"""

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


MAX_PIXELS = 100_000
"""No figure is wider or taller than this many pixels, nor drawn at a larger scale: a larger value is a typo."""


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
        SettingError: ``scale`` not a finite number > 0, ``width`` or ``height`` not a whole number of pixels
            in ``[1, MAX_PIXELS]``.

    Example:
        >>> lp.viz.save(lp.viz.sweep_heatmap(sweep), "sweep.pdf", "sweep.png")
        [PosixPath('sweep.pdf'), PosixPath('sweep.png')]
    """
    if not paths:
        raise LensprobeError("save(fig, path, ...) needs at least one path, e.g. 'figure.pdf'.")
    finite_number("scale", scale, 0, MAX_PIXELS, lo_open=True)  # checked before any file is written
    for name, size in (("width", width), ("height", height)):
        if size is not None:
            count(name, size, 1, MAX_PIXELS)
    files = [Path(p).expanduser() for p in paths]
    formats = [_format(f) for f in files]
    static = [(f, fmt) for f, fmt in zip(files, formats, strict=True) if fmt in STATIC_FORMATS]
    for f, fmt in zip(files, formats, strict=True):
        if fmt in ("html", "json"):
            with atomic_file(f) as tmp:
                if fmt == "html":
                    fig.write_html(tmp, include_plotlyjs=True, full_html=True)
                else:
                    fig.write_json(tmp)
    if static:  # kaleido's batch call does not read the figure's own size: pass it
        _write_static(fig, static, scale=scale, width=width or fig.layout.width or 700,
                      height=height or fig.layout.height or 500)
    return files[0] if len(files) == 1 else files


def export_limit() -> float:
    """Seconds a static export may take: ``$LENSPROBE_EXPORT_TIMEOUT`` when set, else :data:`EXPORT_TIMEOUT`.

    Example:
        >>> export_limit()
        60.0
    """
    return seconds_from_env(EXPORT_TIMEOUT_VAR, EXPORT_TIMEOUT, "a static export")


def _descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on (Linux ``/proc``; none elsewhere)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                out += kids
                todo += kids
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process it started (the browser runs in a session and process group of its
    own, so one left behind by a parent that exited is reached too), and wait until they are gone."""
    pids = [*_descendants(proc.pid), proc.pid]
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate()
    deadline = time.monotonic() + 5  # a SIGKILL is delivered, not awaited: give the kernel a moment
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _run_child(job: dict, browser: str) -> None:
    """Run the export ``job`` in a child process, within :func:`export_limit` seconds."""
    limit = export_limit()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(json.dumps(job).encode("utf-8"), timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise LensprobeError(
            f"static export did not finish within {limit:g} s: the browser {browser} did not answer. Check that "
            f"it starts (`{browser} --headless --version`), set BROWSER_PATH to a Chrome or Chromium that works, "
            f"or allow more time with {EXPORT_TIMEOUT_VAR} (seconds).") from None
    except BaseException:
        _stop(proc)
        raise
    if proc.returncode:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise LensprobeError(f"{NO_BROWSER} ({lines[-1] if lines else f'exit code {proc.returncode}'})")


def _write_static(fig, targets: list[tuple[Path, str]], **opts) -> None:
    """Draw ``fig`` into every ``(file, format)`` in one kaleido call (one browser session), each file
    written whole."""
    import plotly.io as pio

    browser = browser_path()
    if browser is None:
        raise LensprobeError(NO_BROWSER)
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_file(f)) for f, _ in targets]
        _run_child({"figure": pio.to_json(fig), "files": [str(t) for t in tmps], "formats": [fmt for _, fmt in targets],
                    **opts}, browser)
