"""The demo report: every registered study, run on one model, written as one HTML page.

Each study registers a section builder in :data:`DEMO_SECTIONS`: a function
``build(model, *, quick: bool) -> Section | list[Section]`` in :mod:`lensprobe.app.sections`. ``quick=True`` asks for tiny inputs (used by the tests).

Example:
    >>> from lensprobe.app.demo import run_demo
    >>> run_demo("lensprobe-report")        # embedded SmolLM2, offline
    PosixPath('lensprobe-report/index.html')
"""

import time
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from lensprobe.app.sections import attribution, evals, filler, heads, mechanism, thinking
from lensprobe.core.models.loading import is_hooked_model, load_model, model_label
from lensprobe.viz.report import Section, write_report

DEMO_SECTIONS: list[Callable] = [filler.build_demo_sections, mechanism.build_demo_section, heads.build_section,
                                 attribution.build_demo_section, thinking.build_demo_section,
                                 evals.build_demo_section]
"""Section builders, in report order; register yours with one import and one entry."""


def run_demo(out_dir: str | Path = "lensprobe-report", model=None, *, quick: bool = False,
             progress: bool = True) -> Path:
    """Load the model, run every registered section builder, write the report.

    Args:
        out_dir: where ``index.html`` and the CSV/JSON files go.
        model: a loaded model or anything :func:`lensprobe.load_model` takes; ``None``
            for the embedded SmolLM2-135M-Instruct.
        quick: tiny inputs (seconds instead of minutes), for tests.
        progress: show progress bars on stderr.

    Returns:
        The path of ``index.html``.
    """

    start = time.perf_counter()
    if not is_hooked_model(model):
        with tqdm(total=1, desc="loading model", disable=not progress, leave=False) as bar:
            model = load_model(model)
            bar.update()
    sections: list[Section] = []
    with tqdm(DEMO_SECTIONS, desc="report sections", disable=not progress, unit="section") as bar:
        for build in bar:
            bar.set_postfix_str(f"{build.__module__}.{build.__name__}")
            out = build(model, quick=quick)
            sections.extend(out if isinstance(out, (list, tuple)) else [out])
    cfg = model.cfg
    meta = {
        "model": model_label(model),
        "architecture": f"{cfg.n_layers} layers (0-{cfg.n_layers - 1}), {cfg.n_heads} query heads per layer "
                        f"(0-{cfg.n_heads - 1}), context {cfg.n_ctx}",
        "mode": "quick (tiny inputs)" if quick else "full",
        "run time": f"{time.perf_counter() - start:.1f} s",
    }
    return write_report(out_dir, sections, title="lensprobe report", meta=meta)
