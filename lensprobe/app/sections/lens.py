"""The demo report's logit-lens section: what each layer would predict at each greedy generation step, without
and with the Mless filler (``lp.generate(..., lens="logit")`` drawn by :func:`lensprobe.viz.logit_lens`)."""

import html

import torch

from lensprobe.app.sections.filler import INDEX_NOTE_HTML, demo_question
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import Prompt, prompt_json
from lensprobe.generation.loop import generate
from lensprobe.generation.traces.trace import GenerationTrace
from lensprobe.studies.filler import FillerSetup, condition_prompts
from lensprobe.viz import logit_lens
from lensprobe.viz.report import Section

__all__ = ["CONDITIONS", "TITLE", "build_demo_section", "lens_summary", "lens_traces"]

TITLE = "Logit lens per layer and generation step, without and with filler"
CONDITIONS = ("w/o", "w/ Mless")


def lens_traces(model, prompts: dict[str, Prompt], steps: int) -> dict[str, GenerationTrace]:
    """Per condition's prompt, a greedy generation of ``steps`` tokens with every layer's logit lens (top 3
    tokens)."""
    return {name: generate(model, prompt, max_new_tokens=steps, lens="logit", lens_top_k=3)
            for name, prompt in prompts.items()}


def lens_summary(trace: GenerationTrace) -> dict:
    """The numbers the section's text states for one generation (row 0, the steps it ran): the first layer from
    which the chosen token stays the layer's top token (the median over steps), the share of steps where the
    first layer read already ranks it first, and the mean entropy and KL(model || layer) of the first and last
    layers read."""
    lens = trace.lens
    assert lens is not None
    n = int(trace.recorded_rows[0].sum())
    rank, ent, kl = lens.chosen_rank_rows[0, :n], lens.entropy_rows[0, :n], lens.kl_rows[0, :n]
    top = rank == 0  # [step, layer]
    # from which layer on each step's chosen token stays first (a suffix of True)
    settled = torch.flip(torch.cumprod(torch.flip(top, [1]).long(), dim=1), [1]).bool()
    first = torch.where(settled.any(1), settled.float().argmax(1), torch.tensor(len(lens.layers)))
    layers = torch.tensor(lens.layers + [lens.layers[-1] + 1])
    return {"steps": n, "layers": list(lens.layers),
            "settled_layer_median": int(layers[first].median()),
            "first_layer_top_share": float(top[:, 0].float().mean()),
            "entropy_first": float(ent[:, 0].mean()), "entropy_last": float(ent[:, -1].mean()),
            "kl_first": float(kl[:, 0].mean()), "kl_last": float(kl[:, -1].mean())}


def _described(summaries: dict) -> str:
    parts = []
    for cond, s in summaries.items():
        first, last = s["layers"][0], s["layers"][-1]
        parts.append(f"<b>{html.escape(cond)}</b>: over {s['steps']} steps the chosen token becomes and stays the "
                     f"top token from layer {s['settled_layer_median']} on (median step), layer {first} already "
                     f"ranks it first at {s['first_layer_top_share']:.0%} of the steps; mean entropy "
                     f"{s['entropy_first']:.2f} nats at layer {first} and {s['entropy_last']:.2f} at layer {last}, "
                     f"KL(model || layer) {s['kl_first']:.2f} and {s['kl_last']:.2g} nats")
    return "; ".join(parts) + "."


def build_demo_section(model, *, quick: bool = False) -> Section:
    """The logit-lens section (registered in ``lensprobe.app.demo``): w/o and w/ Mless, every layer, 16 greedy
    steps (``quick``: the built-in question, 4 steps)."""
    question, source = demo_question(quick)
    steps = 4 if quick else 16
    prompts = condition_prompts(model, question, FillerSetup(conditions=CONDITIONS))
    traces = lens_traces(model, prompts, steps)
    summaries = {cond: lens_summary(tr) for cond, tr in traces.items()}
    name = html.escape(model_label(model))
    figures = [logit_lens(tr, 0, color=color, title=f"{model_label(model)}, {cond}: logit lens ({color})")
               for cond, tr in traces.items() for color in ("entropy", "rank")]
    return Section(
        title=TITLE,
        intro=(
            f"<p>Model: <b>{name}</b>. Question: {html.escape(source)}, after the paper's MATH system prompt, "
            f"without filler and with the Mless filler (\"/\" x 55), {steps} greedy steps. At every step each "
            "layer's residual stream (<code>blocks.L.hook_resid_post</code>) at the newest position is put through "
            "the model's own final norm and unembedding (the <i>logit lens</i>; the last layer is the model's own "
            "distribution). The heatmaps show, per layer and step (step 0 = the last prompt position), the "
            "layer's entropy and the rank of the token the model chose under the layer's distribution; hover for "
            f"the layer's top token. {_described(summaries)} {INDEX_NOTE_HTML}</p>"),
        figures=figures,
        tables={"lens_" + cond.replace("/", "").replace(" ", "_").strip("_"): tr.lens.to_dataframe()
                for cond, tr in traces.items() if tr.lens is not None},
        data={"study": {"model": model_label(model), "question": question, "question_source": source,
                        "max_new_tokens": steps, "summary": summaries,
                        "texts": {c: tr.texts[0] for c, tr in traces.items()},
                        "indexing": "0-based layers; step 0 = the last prompt position",
                        "prompts": {c: prompt_json(p) for c, p in prompts.items()}}},
    )
