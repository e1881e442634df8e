"""The demo report's mechanism section: how the filler rescales layer-0 attention, and where the
layer-0 MLP activations go (w/o filler, w/ Mless, w/o filler + ARM)."""

import html

from lensprobe.app.sections.filler import INDEX_NOTE_HTML, demo_question
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.core.storage.jsonable import stable_repr
from lensprobe.interventions.arm import ARM
from lensprobe.studies.mechanism import (
    activation_stats,
    affine_fit_summary,
    filler_affine_fit,
    mechanism_prompts,
)
from lensprobe.viz import activation_histogram_figure, affine_fit_figure
from lensprobe.viz.report import Section

TITLE = "Mechanism: filler tokens rescale layer-0 attention and move MLP activations away from zero"
ARM_CONDITION = "w/o + ARM"
MECHANISM_ARM = {"c": 0.1, "percentile": 95}
"""ARM settings for a model without a preset: the authors' Qwen2.5-Math-7B values on MATH-500."""


def build_demo_section(model, *, quick: bool = False) -> Section:
    """The mechanism section (registered in ``lensprobe.app.demo``): layer 0 only, one question.

    ``quick`` uses the built-in short question and 30 histogram bins.
    """
    question, source = demo_question(quick)
    prompts = mechanism_prompts(model, question)
    arm = ARM.preset(model, fallback=MECHANISM_ARM, layer=0, seed=0)
    fit = filler_affine_fit(model, prompts["w/ Mless"], prompts["w/o"], layer=0)
    summary = affine_fit_summary(fit)
    arm_c = arm.c if arm.variant == "default" and arm.c is not None else 0.1
    stats = activation_stats(model, {**prompts, ARM_CONDITION: prompts["w/o"]}, layer=0,
                             interventions={ARM_CONDITION: [arm]}, c=arm_c, bins=30 if quick else 80)
    name = html.escape(model_label(model))
    near = ", ".join(f"{html.escape(c)}: {v:.1%}" for c, v in zip(stats.summary["condition"],
                                                                   stats.summary["near_zero"], strict=True))
    return Section(
        title=TITLE,
        intro=(
            f"<p>Model: <b>{name}</b>. Question: {html.escape(source)}, after the paper's MATH system prompt, "
            "without filler and with the Mless filler (\"/\" x 55) between system prompt and question.</p>"
            "<p>First figure: for every layer-0 head and every question position, "
            "<code>lambda = 1 - attention on the filler</code> (top) and how well "
            "<code>out_with = lambda * out_without + bias</code> predicts the head's recorded output with "
            "filler (bottom; <code>bias</code> = the filler keys' attention-weighted values). The map is exact "
            "when the original keys' scores do not change with the filler; with rotary position embeddings the "
            "question moves by the filler length, so the error measures how far from exact the rescaling is. "
            "Second figure: the distribution of the layer-0 MLP activation <code>act_fn(gate_proj(x))</code> over "
            "the question's positions (the same tokens in every condition), without filler, with Mless, and "
            f"without filler but with ARM ({html.escape(stable_repr(arm))}), which edits that activation directly. "
            f"Shaded: the near-zero band <code>|a| &lt; eps</code>, <code>eps = 1.4826 * MAD(|a|) * c</code> "
            f"= {stats.eps:.3g} from the run without filler. Share of entries in the band: {near}. "
            f"{INDEX_NOTE_HTML}</p>"
        ),
        figures=[
            affine_fit_figure(fit, title=f"{name}: filler tokens rescale layer-0 attention"),
            activation_histogram_figure(stats, title=f"{name}: layer-0 MLP activations act_fn(gate), per condition"),
        ],
        tables={"affine_fit": fit, "affine_fit_summary": summary, "activation_histogram": stats.histogram,
                "activation_summary": stats.summary},
        data={"study": {"model": model_label(model), "question": question, "question_source": source, "layer": 0,
                        "eps": stats.eps, "eps_reference": stats.reference, "arm": stable_repr(arm),
                        "indexing": "0-based layers and heads (L0H13 = paper's layer 1 head 14)",
                        "prompts": {c: prompt_json(p) for c, p in prompts.items()}}},
    )
