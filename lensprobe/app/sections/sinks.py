"""The demo report's attention-sink section: how much attention the first token and the filler take, layer
by layer and per generation step, and the residual stream's massive activations, without and with the Mless
filler."""

import html
from collections.abc import Mapping

from torch import Tensor

from lensprobe.app.sections.filler import INDEX_NOTE_HTML, demo_question
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import Prompt, prompt_json
from lensprobe.generation.loop import generate
from lensprobe.generation.traces.activations import Record
from lensprobe.generation.traces.trace import GenerationTrace
from lensprobe.studies.filler import FillerSetup
from lensprobe.studies.sinks import FIRST, AttentionSinks, attention_sinks
from lensprobe.viz import activation_norm_figure, massive_activation_figure, sink_heatmap, sink_steps_figure
from lensprobe.viz.report import Section

__all__ = ["TITLE", "build_demo_section", "norm_traces", "residual_norm", "sink_figures", "sink_summary", "sink_tables"]

TITLE = "Attention sinks and massive activations, without and with filler"


def residual_norm(x: Tensor) -> Tensor:
    """The L2 norm of each row's newest residual stream (a ``reduce`` of :class:`lensprobe.Record`)."""
    return x.norm(dim=-1)


def norm_traces(model, result: AttentionSinks, **generation) -> dict[str, GenerationTrace]:
    """Per condition of ``result``, a generation recording the norm of every layer's residual stream per step
    (the same greedy settings, so the same tokens)."""
    out = {}
    for name, prompt in result.prompts.items():
        out[name] = generate(model, prompt, record=Record("blocks.*.hook_resid_post", reduce=residual_norm),
                             **generation)
    return out


def sink_tables(result: AttentionSinks, *, queries: bool = False) -> dict:
    """The result's tables by file stem (the per-query table only when asked: it is the largest)."""
    tables = {"sink_prompt": result.prompt, "sink_head_means": result.head_means(), "sink_steps": result.steps,
              "sink_step_means": result.step_means(), "massive": result.massive}
    if queries:
        tables["sink_queries"] = result.queries
    return tables


def sink_figures(result: AttentionSinks, traces: Mapping[str, GenerationTrace]) -> dict:
    """The section's figures by file stem: the sink heatmap of each target, the mass per step, the massive
    activations' ratio, the residual norms per step."""
    name = result.model_name
    figs = {f"sink_heatmap_{t.replace(' ', '_')}": sink_heatmap(result, target=t, title=f"{name}: attention on the {t}")
            for t in result.targets}
    figs["sink_steps"] = sink_steps_figure(result, title=f"{name}: attention on the first token per step")
    figs["massive_prompt"] = massive_activation_figure(result, title=f"{name}: massive activations over the prompt")
    figs["activation_norms"] = activation_norm_figure(dict(traces), title=f"{name}: residual stream norm per step")
    return figs


def sink_summary(result: AttentionSinks) -> dict:
    """The numbers the section's text states: per condition, the first token's mean share at the first and
    last layer measured, the filler's at the first, and the largest ratio over the prompt with its token and
    dimension."""
    means = result.head_means()
    first, last = min(result.layers), max(result.layers)
    out = {}
    for cond in result.conditions:
        rows = means[means["condition"] == cond]

        def at(layer: int, target: str, rows=rows) -> float | None:
            hit = rows[(rows["layer"] == layer) & (rows["target"] == target)]["mass"]
            return float(hit.iloc[0]) if len(hit) else None

        big = result.largest("prompt")
        big = big[big["condition"] == cond].sort_values("ratio", ascending=False).iloc[0]
        out[cond] = {"first_token_first_layer": at(first, FIRST), "first_token_last_layer": at(last, FIRST),
                     "filler_first_layer": at(first, "filler"), "largest_ratio": float(big["ratio"]),
                     "largest_layer": int(big["layer"]), "largest_token": str(big["token"]),
                     "largest_position": int(big["position"]), "largest_dim": int(big["dim"])}
    return out


def _described(summary: dict, first: int, last: int) -> str:
    parts = []
    for cond, s in summary.items():
        filler = (f", the filler {s['filler_first_layer']:.1%} at layer {first}"
                  if s["filler_first_layer"] is not None else "")
        parts.append(f"<b>{html.escape(cond)}</b>: the first token takes {s['first_token_first_layer']:.1%} of a later "
                     f"query's attention at layer {first} and {s['first_token_last_layer']:.1%} at layer {last}{filler}; "
                     f"the largest residual entry is {s['largest_ratio']:.0f}x the median (layer {s['largest_layer']}, "
                     f"dimension {s['largest_dim']}, token {html.escape(repr(s['largest_token']))} at position "
                     f"{s['largest_position']})")
    return "; ".join(parts) + "."


def build_demo_section(model, *, quick: bool = False) -> Section:
    """The sink section (registered in ``lensprobe.app.demo``): w/o and w/ Mless, every layer, 16 greedy
    steps (``quick``: the built-in question, 4 steps)."""
    question, source = demo_question(quick)
    steps = 4 if quick else 16
    result = attention_sinks(model, question, conditions=("w/o", "w/ Mless"), setup=FillerSetup(), max_new_tokens=steps)
    traces = norm_traces(model, result, max_new_tokens=steps)
    summary = sink_summary(result)
    first, last = min(result.layers), max(result.layers)
    name = html.escape(model_label(model))
    return Section(
        title=TITLE,
        intro=(
            f"<p>Model: <b>{name}</b>. Question: {html.escape(source)}, after the paper's MATH system prompt, "
            "without filler and with the Mless filler (\"/\" x 55). Per layer and head: the attention each query "
            "puts on the first token (the <i>attention sink</i>) and on the filler, averaged over the prompt's "
            f"queries after it, then the newest query's at each of {steps} greedy generation steps (step 0 = the "
            "last prompt position). Per layer: the largest |entry| of the residual stream "
            "(<code>blocks.L.hook_resid_post</code>) over the median |entry| (<i>massive activations</i>), and "
            "the residual stream's norm per step. Everything is reduced inside the hooks: no attention matrix is "
            f"kept. {_described(summary, first, last)} {INDEX_NOTE_HTML}</p>"),
        figures=list(sink_figures(result, traces).values()),
        tables=sink_tables(result),
        data={"study": {"model": model_label(model), "question": question, "question_source": source,
                        "layers": result.layers, "max_new_tokens": steps, "summary": summary,
                        "texts": {c: tr.texts[0] for c, tr in result.traces.items()},
                        "indexing": "0-based layers and heads (L0H13 = paper's layer 1 head 14)",
                        "prompts": {c: prompt_json(p) for c, p in result.prompts.items() if isinstance(p, Prompt)}}},
    )
