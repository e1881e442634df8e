"""mkdocs hook: the figures the guides embed, drawn by the build on the embedded SmolLM2 model.

Each figure is computed here from the embedded model (offline, about a minute on two CPU cores) with the
same public calls the guides show, and written as an HTML page under ``figures/`` next to one shared
``plotly.min.js`` (from the installed plotly package, so the pages work offline), at its own height and
width (:func:`lensprobe.viz.embed.figure_page`; a narrower column scrolls it sideways). The guides embed them with
``<iframe src="../figures/NAME.html" width="100%" frameborder="0">``, and this hook gives each frame its
figure's height; ``tests/test_api_reference.py`` checks that every embedded figure was written by the build
and that its frame is tall enough. The figures are never committed, so they cannot go stale.
"""

import re
import warnings

import plotly.offline
from mkdocs.structure.files import File

from lensprobe.viz.embed import figure_page, frame_height

QUESTION = "What is 12+7?"


def _figures() -> dict:
    import torch

    import lensprobe as lp

    torch.manual_seed(0)
    model = lp.load_model()
    figs = {}
    res = lp.studies.attention_received_by_condition(model, QUESTION, layers=[0])
    figs["attention_received"] = lp.viz.attention_received_figure(res, [(0, 3)])
    every = lp.studies.attention_received_by_condition(model, QUESTION)
    figs["segment_attention"] = lp.viz.segment_attention_figure(lp.studies.segment_attention(every, "question"))

    p0 = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    p1 = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    stats = lp.studies.activation_stats(model, {"w/o": p0, "w/ Mless": p1, "w/o + ARM": p0},
                                interventions={"w/o + ARM": [lp.ARM(c=0.1, percentile=95, seed=0)]})
    figs["activation_histogram"] = lp.viz.activation_histogram_figure(stats)

    sinks = lp.studies.attention_sinks(model, QUESTION, conditions=["w/o", "w/ Mless"], max_new_tokens=4)
    figs["sinks"] = lp.viz.sink_heatmap(sinks)

    sweep = lp.ablation_sweep(model, [p0], "entropy", progress=False)
    figs["sweep"] = lp.viz.sweep_heatmap(sweep)

    thinking = lp.studies.with_thinking_token(model)
    pt = lp.build_prompt(thinking, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    traces = lp.studies.compare_thinking(thinking, [pt], ["fusion", "pause"], max_new_tokens=32,
                                 think_when=lp.generation.schedule.every(4), n_samples=3, do_sample=True, seed=0)
    with warnings.catch_warnings():  # steps before the first thinking position have no attention onto it (NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = lp.generation.trace_summary(traces, band="std")
    figs["thinking_trace"] = lp.viz.generation_trace_figure(summary)

    grid = lp.studies.ascii_grid()
    g0, g1 = lp.build_prompt(model, grid), lp.build_prompt(model, grid, filler=lp.Filler.meaningless())
    table = lp.studies.compare_token_class_attention({"w/o filler": (model, g0), "w/ Mless": (model, g1)}, layers=[0, 16, 20, 27])
    figs["token_classes"] = lp.viz.token_class_figure(table)
    return figs


_FRAME_HEIGHTS: dict[str, int] = {}
"""Each figure's frame height in pixels (its layout height and the toolbar band), set by ``on_files``."""

_IFRAME = re.compile(r'<iframe src="\.\./figures/([\w-]+)\.html"([^>]*)>')


def on_files(files, config, **kwargs):
    files.append(File.generated(config, "figures/plotly.min.js", content=plotly.offline.get_plotlyjs()))
    for name, fig in _figures().items():
        _FRAME_HEIGHTS[name] = frame_height(fig)
        files.append(File.generated(config, f"figures/{name}.html", content=figure_page(fig)))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    """Every ``<iframe src="../figures/NAME.html">`` gets the figure's own height (a guide never writes one)."""

    def sized(m):
        attrs = re.sub(r'\s(height|style)="[^"]*"', "", m.group(2))
        height = _FRAME_HEIGHTS.get(m.group(1))
        return f'<iframe src="../figures/{m.group(1)}.html"{attrs}' + (f' height="{height}"' if height else "") + ">"

    return _IFRAME.sub(sized, markdown)
