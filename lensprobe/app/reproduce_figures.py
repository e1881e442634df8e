"""The studies a figure recipe can draw (``figure = "..."`` in a recipe), built on the report sections.

Each entry of :data:`FIGURES` takes ``(model, quick)`` and returns report sections; ``quick`` uses
short inputs (a smoke run). The papers publish no numbers for these figures: a recipe run shows the
figure on the model given, to be compared with the paper's by eye.
"""

import html
from collections.abc import Callable

from lensprobe.app.sections import mechanism as mechanism_section
from lensprobe.app.sections import thinking as thinking_section
from lensprobe.app.sections.filler import (
    HEADS_PER_LAYER,
    attention_section,
    demo_question,
    filler_vs_random_section,
    token_class_section,
)
from lensprobe.app.sections.heads import head_attention_section
from lensprobe.core.errors import LensprobeError
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, Filler, build_prompt
from lensprobe.evals.results.stats import accuracy
from lensprobe.experiments.headpatch import patch_heads
from lensprobe.studies.filler import FillerSetup, attention_received_by_condition, heads_by_change
from lensprobe.viz.ablation import sweep_heatmap
from lensprobe.viz.evals import accuracy_by_level
from lensprobe.viz.report import Section

__all__ = ["FIGURES", "curve_sections", "figure_sections", "filler_length"]


def _top_heads(model, question: str, setup: FillerSetup, layers: list[int]):
    res = attention_received_by_condition(model, question, layers=layers, setup=setup)
    top = heads_by_change(res, k=HEADS_PER_LAYER).sort_values(["layer", "change"], ascending=[True, False],
                                                              kind="stable")
    return res, [(int(a), int(b)) for a, b in zip(top["layer"], top["head"], strict=True)]


def _layers(model, quick: bool) -> list[int]:
    n = int(model.cfg.n_layers)
    return [0] if quick else sorted({0, 1, n // 2, n - 1})


def filler_per_head(model, quick: bool) -> list[Section]:
    """Attention per position with vs without the Mless filler at the heads it changes most."""
    question, source = demo_question(quick)
    layers = _layers(model, quick)
    res, pairs = _top_heads(model, question, FillerSetup(), layers)
    return [attention_section(model, res, pairs, source, layers)]


def filler_vs_random(model, quick: bool) -> list[Section]:
    """The Mless filler vs a random sentence of the same length at the layer-0 head it changes most."""
    question, _ = demo_question(quick)
    setup = FillerSetup()
    _, pairs = _top_heads(model, question, setup, [0])
    return [filler_vs_random_section(model, question, setup, *pairs[0])]


def token_classes(model, quick: bool) -> list[Section]:
    """Attention per token class per layer on an ASCII grid, with vs without filler."""
    return [token_class_section(model, FillerSetup(), quick)]


def head_attention(model, quick: bool) -> list[Section]:
    """Average attention on one head per position under None / Mless / Mful, and over a longer sequence."""
    question, _ = demo_question(quick)
    setup = FillerSetup(conditions=("w/o", "w/ Mless", "w/ Mful"))
    _, pairs = _top_heads(model, question, setup, [0])
    return [head_attention_section(model, question, setup, pairs[0], quick)]


def thinking_traces(model, quick: bool) -> list[Section]:
    """Entropy and attention onto <thinking> per generation step: latent fusion vs pause vs none."""
    return [thinking_section.build_demo_section(model, quick=quick)]


def filler_heads_patched(model, quick: bool) -> list[Section]:
    """Which heads carry the entropy change when the 55 ``/`` are inserted: each head's output on the prompt
    with the filler replaced, at the positions both prompts share, by its output without it."""
    question, source = demo_question(quick)
    with_filler = build_prompt(model, question, system=MATH_SYSTEM_PROMPT, filler=Filler.meaningless())
    without = build_prompt(model, question, system=MATH_SYSTEM_PROMPT)
    res = patch_heads(model, with_filler, without, "entropy")
    change = float(res.baseline[0]) - float(res.corrupted[0])  # kept by patch_heads: no other forward
    intro = (f"<p>Question: {html.escape(source)}. Next-token entropy at the last position: "
             f"{float(res.baseline[0]):.3f} nats with the 55 '/' filler, {change:+.3f} against the prompt without it. "
             "Each head's output on the prompt with the filler is replaced, at every position both prompts share "
             f"({len(res.clean_positions)} tokens, paired by segment), by its output without the filler; one exact "
             "run per head. Blue: patching the head moves the entropy down (toward the run without filler). The "
             "filler's own positions have no counterpart and are not patched.</p>"
             f"<p>{html.escape(res.summary())}.</p>")
    return [Section("Heads that carry the filler's entropy change (per-head patching)", intro,
                    figures=[sweep_heatmap(res)], tables={"patched_heads": res.to_dataframe(), "top": res.top(10)})]


def mechanism(model, quick: bool) -> list[Section]:
    """The activation redistribution (the paper's mechanism figures): the filler rescales layer-0 attention (an
    affine map per head) and moves the layer-0 MLP activations away from zero, without filler, with Mless, and
    without filler + ARM."""
    return [mechanism_section.build_demo_section(model, quick=quick)]


FIGURES: dict[str, Callable[..., list[Section]]] = {
    "filler-attention-per-head": filler_per_head,
    "filler-vs-random": filler_vs_random,
    "token-class-attention": token_classes,
    "head-attention-by-condition": head_attention,
    "thinking-traces": thinking_traces,
    "filler-heads-patched": filler_heads_patched,
    "activation-redistribution": mechanism,
}
"""Figure name -> ``(model, quick) -> sections``."""


def figure_sections(name: str, model, *, quick: bool = False) -> list[Section]:
    """The sections of figure ``name`` on ``model``.

    Raises:
        LensprobeError: an unknown figure name.

    Example:
        >>> sections = figure_sections("token-class-attention", model, quick=True)
    """
    if name not in FIGURES:
        raise LensprobeError(f"unknown figure {name!r}: a figure recipe draws one of {tuple(FIGURES)}.")
    return FIGURES[name](model, quick)


def filler_length(condition) -> int | None:
    """Repetitions in ``condition``'s filler (0 without one; ``None`` for a filler drawn per tokenizer)."""
    if condition.filler is None:
        return 0
    return len(condition.filler.content.split()) if isinstance(condition.filler, Filler) else None


def curve_sections(recipe, bench: str, conds, rows) -> list[Section]:
    """A table recipe's ``curve``: the authors' grader's accuracy (95% Wilson interval) on ``bench`` against each
    condition's filler length (Figure 8), from the run's ``rows`` (seed 0); ``[]`` without ``curve``."""
    lengths = {c.name: filler_length(c) for c in conds if filler_length(c) is not None}
    graded = rows[rows["condition"].isin(list(lengths)) & rows["paper-exact"].notna()]
    if not recipe.curve or graded.empty:
        return []
    table = accuracy(graded, "condition", grader="paper-exact")
    table["level"] = [lengths[c] for c in table["condition"]]
    table = table.sort_values("level", kind="stable").assign(condition=bench)
    fig = accuracy_by_level(table, title=f"{bench}: accuracy vs {recipe.curve}")
    fig.update_xaxes(title_text=recipe.curve, dtick=None)
    intro = (f"<p>Accuracy (the authors' grader) against {html.escape(recipe.curve)}; bars: 95% Wilson intervals. "
             "The paper shows this as a figure without numbers: compare the shape by eye.</p>")
    return [Section(f"{bench}: accuracy vs {recipe.curve}", intro, figures=[fig],
                    tables={"curve": table})]
