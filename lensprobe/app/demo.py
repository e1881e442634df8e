"""The demo report: every registered study, run on one model, written as one HTML page.

Each study registers a :class:`DemoSection` in :data:`DEMO_SECTIONS`: a title (what the progress bar
shows while it runs), its cost (seconds of a full run on a 2-core machine, which weights the bar's time estimate:
:class:`~lensprobe.app.schedule.CostBar`) and a builder ``build(model, *, quick: bool, progress: bool) -> Section | list[Section]``
in :mod:`lensprobe.app.sections` (``progress`` may be left out: it shows the builder's inner progress bars).
``quick=True`` asks for tiny inputs (used by the tests).

Example:
    >>> from lensprobe.app.demo import run_demo
    >>> run_demo("lensprobe-report")        # embedded SmolLM2, offline
    PosixPath('lensprobe-report/index.html')
"""

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lensprobe.app.schedule import CostBar
from lensprobe.app.sections import attribution, evals, filler, heads, lens, mechanism, sinks, thinking
from lensprobe.core.models.loading import is_hooked_model, load_model, model_label
from lensprobe.core.progress import tqdm
from lensprobe.core.storage.nesting import parse_json
from lensprobe.viz.report import Section, write_report


@dataclass(frozen=True)
class DemoSection:
    """One study of the demo report.

    Attributes:
        title: what the progress bar says while it runs.
        build: ``build(model, *, quick, progress=False) -> Section | list[Section]``.
        cost: seconds of a full run on a 2-core machine (the report's ``study times`` line measures them): the
            weight of this study in the progress bar's time estimate.
    """

    title: str
    build: Callable
    cost: float = 60.0


COST: dict[str, float] = {"filler": 4.0, "mechanism": 0.5, "sinks": 11.0, "lens": 4.0, "heads": 151.0,
                          "attribution": 98.0, "thinking": 39.0, "evals": 134.0}
"""Seconds of each study in a full run (their proportions weight the report bar's estimate). Measured in one
``make demo`` of a fresh clone on a quiet 2-core machine (the report's ``study times`` line: filler 4 s, mechanism
under 1 s, sinks 11 s, lens 4 s, heads 151 s, attribution 98 s, thinking 39 s, evals 134 s; 441 s in all). On a
busy machine every study takes longer, in about the same proportions. A report's ``study times`` line gives the
seconds of its own run: put them here when a study changes."""

DEMO_SECTIONS: list[DemoSection] = [
    DemoSection("Meaningless tokens: attention received", filler.build_demo_sections, COST["filler"]),
    DemoSection("The mechanism: activations and ARM", mechanism.build_demo_section, COST["mechanism"]),
    DemoSection("Attention sinks and massive activations", sinks.build_demo_section, COST["sinks"]),
    DemoSection("Logit lens per layer and step", lens.build_demo_section, COST["lens"]),
    DemoSection("Head ablation sweep, single ablations, patching", heads.build_section, COST["heads"]),
    DemoSection("Head attribution (AtP*) verified by ablation", attribution.build_demo_section, COST["attribution"]),
    DemoSection("Latent thinking traces", thinking.build_demo_section, COST["thinking"]),
    DemoSection("Evaluations: arithmetic and MATH-500", evals.build_demo_section, COST["evals"]),
]
"""The studies, in report order; register yours with one import and one entry (with its measured cost)."""


def _build(entry: DemoSection, model, quick: bool, progress: bool) -> list[Section]:
    """Run one study's builder (with inner progress bars when it takes ``progress``)."""
    kwargs = {"progress": progress} if "progress" in inspect.signature(entry.build).parameters else {}
    out = entry.build(model, quick=quick, **kwargs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def run_demo(out_dir: str | Path = "lensprobe-report", model=None, *, quick: bool = False,
             progress: bool = True) -> Path:
    """Load the model, run every registered section builder, write the report.

    Args:
        out_dir: where ``index.html`` and the CSV/JSON files go.
        model: a loaded model or anything :func:`lensprobe.load_model` takes; ``None``
            for the embedded SmolLM2-135M-Instruct.
        quick: tiny inputs (seconds instead of minutes), for tests.
        progress: show progress bars on stderr: one per study, named by its title, and the study's
            own (sweep units, generation rows, problems) below it.

    Returns:
        The path of ``index.html`` (:func:`report_contents` says what it holds).
    """

    start = time.perf_counter()
    if not is_hooked_model(model):
        with tqdm(total=1, desc="loading model", disable=not progress, leave=False) as bar:
            model = load_model(model)
            bar.update()
    sections: list[Section] = []
    took: list[str] = []
    with CostBar([(e.title, e.cost) for e in DEMO_SECTIONS], desc="report", disable=not progress,
                 reference="on a quiet 2-core machine") as bar:
        for entry in DEMO_SECTIONS:
            bar.start(entry.title)
            began = time.perf_counter()
            sections.extend(_build(entry, model, quick, progress))
            took.append(f"{entry.title} {time.perf_counter() - began:.0f} s")
            bar.done()
    cfg = model.cfg
    meta = {
        "model": model_label(model),
        "architecture": f"{cfg.n_layers} layers (0-{cfg.n_layers - 1}), {cfg.n_heads} query heads per layer "
                        f"(0-{cfg.n_heads - 1}), context {cfg.n_ctx}",
        "mode": "quick (tiny inputs)" if quick else "full",
        "run time": f"{time.perf_counter() - start:.1f} s",
        "study times": "; ".join(took),
    }
    return write_report(out_dir, sections, title="lensprobe report", meta=meta)


def report_contents(index: str | Path) -> str:
    """What the report at ``index`` holds and where, as lines to print: its sections, with their figures
    and the folders of their numbers (from the ``report.json`` beside it).

    Example:
        >>> print(report_contents("lensprobe-report/index.html"))
    """
    index = Path(index).resolve()
    listing = parse_json((index.parent / "report.json").read_text(encoding="utf-8"), "report listing")
    sections = listing["sections"]
    n_files = sum(len(s["files"]) for s in sections)
    lines = [f"report: {index} (one page, opens offline in a browser)",
             f"{len(sections)} sections, {sum(s['n_figures'] for s in sections)} figures, {n_files} files of "
             f"numbers (CSV tables, JSON data) in a folder per section beside it:"]
    for i, sec in enumerate(sections, start=1):
        views = f", {_count(sec['n_html'], 'interactive view')}" if sec["n_html"] else ""
        where = f"; numbers: {sec['slug']}/ ({_count(len(sec['files']), 'file')})" if sec["files"] else ""
        lines.append(f"  {i:>2}. {sec['title']}: {_count(sec['n_figures'], 'figure')}{views}{where}")
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
