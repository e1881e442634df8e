"""The demo report's meaningless-token sections: attention with vs without filler, filler vs a
random sentence, attention per token class, and an interactive layer-0 view."""

import html

from lensprobe.core.hooks.heads import head_label
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import prompt_json
from lensprobe.evals.problems.files import jsonl_rows
from lensprobe.evals.problems.load import math500_path
from lensprobe.studies.filler import (
    AttentionReceived,
    FillerSetup,
    attention_received_by_condition,
    attention_view_pattern,
    condition_changes,
    heads_by_change,
)
from lensprobe.studies.filler_random import filler_vs_random
from lensprobe.studies.token_classes import ascii_grid, class_layers, compare_token_class_attention
from lensprobe.viz import (
    attention_received_figure,
    attention_view_html,
    condition_change_figure,
    filler_vs_random_figure,
    token_class_figure,
)
from lensprobe.viz.report import Section
from lensprobe.viz.style import condition_label

BUILTIN_QUESTION = "What is the value of $\\sqrt{36 \\times \\sqrt{16}}$?"
"""The question of ``quick`` runs (and when MATH-500 holds no level-1 problem)."""

INDEX_NOTE_HTML = ("Layer and head indices are 0-based, as in TransformerLens: <b>L0H13</b> is the "
                   "paper's \"layer 1, head 14\".")

HEADS_PER_LAYER = 2
"""Heads shown per layer: those whose aligned series changes most with the Mless filler."""


def demo_question(quick: bool = False) -> tuple[str, str]:
    """The demo's question and where it came from.

    The first level-1 problem of MATH-500 (:func:`lensprobe.evals.math500_path`: ``$LENSPROBE_MATH500``,
    else the copy lensprobe ships), else a built-in question; ``quick`` always uses the
    built-in one.
    """
    path = None if quick else math500_path()
    if path is not None:
        for _, row in jsonl_rows(path):
            if isinstance(row, dict) and row.get("level") == 1 and row.get("problem"):
                return row["problem"], f"MATH-500 {row.get('unique_id', '')} (level 1)"
    return BUILTIN_QUESTION, "built-in example question"


def build_demo_sections(model, *, quick: bool = False) -> list:
    """The meaningless-token sections of the demo report (registered in ``lensprobe.app.demo``).

    Runs the four conditions on a MATH question, picks for each chosen layer the heads
    whose aligned series changes most with the Mless filler, and adds the filler vs
    random sentence panel, the token-class bars on an ASCII grid, and a circuitsvis view
    of layer 0. ``quick`` uses a short question, layer 0 only and a small grid.
    """
    n_layers = int(model.cfg.n_layers)
    question, source = demo_question(quick)
    setup = FillerSetup()
    layers = [0] if quick else sorted({0, 1, n_layers // 2, n_layers - 1})
    res = attention_received_by_condition(model, question, layers=layers, setup=setup)
    top = heads_by_change(res, k=HEADS_PER_LAYER).sort_values(["layer", "change"], ascending=[True, False],
                                                              kind="stable")
    pairs = [(int(a), int(b)) for a, b in zip(top["layer"], top["head"], strict=True)]
    return [
        attention_section(model, res, pairs, source, layers),
        filler_vs_random_section(model, question, setup, *pairs[0]),
        token_class_section(model, setup, quick),
        attention_view_section(model, res),
    ]


def attention_section(model, res: AttentionReceived, pairs: list[tuple[int, int]], source: str,
                      layers: list[int]) -> Section:
    """Attention received with vs without filler at the chosen heads, and the change per head."""
    name = html.escape(model_label(model))
    setup = res.setup
    changes = condition_changes(res)
    chosen = set(pairs)
    shown = res.table[[(int(a), int(b)) in chosen
                       for a, b in zip(res.table["layer"], res.table["head"], strict=True)]]
    spans = {c: res.filler_span(c) for c in res.conditions}
    mless_span = res.filled_span("w/ Mless")
    q_text = res.question if len(res.question) <= 600 else res.question[:600] + " ..."
    labels = ", ".join(condition_label(c) for c in res.conditions)
    return Section(
        title="Meaningless tokens: attention received with vs without filler",
        intro=(
            f"<p>Model: <b>{name}</b>. Question: {html.escape(source)}, after the paper's MATH system prompt. "
            f"Conditions: {labels} (Mless = \"{setup.symbol}\" x {setup.count}, Mful = \"{setup.word}\" x "
            f"{setup.count}, random sentence = real words with as many tokens as Mless), inserted between the "
            "system prompt and the question.</p>"
            "<p>First figure, one row per (layer, head): the average attention each token position receives "
            "from the positions after it (mean over queries i &gt; j). Left: without filler vs with Mless, "
            "aligned by dropping the filler span, so position k is the same token in both. Right: the Mless "
            f"prompt over all its positions, the filler span shaded (positions {mless_span[0]}-{mless_span[1] - 1})."
            f" Heads shown: in each of layers {', '.join(map(str, layers))}, the {HEADS_PER_LAYER} heads whose "
            "aligned series changes most with Mless. Second figure: that change (mean |condition - w/o filler| "
            f"over aligned positions) for every head of those layers and every filler condition. {INDEX_NOTE_HTML}"
            f"</p><details><summary>Question text</summary><pre>{html.escape(q_text)}</pre></details>"
        ),
        figures=[
            attention_received_figure(res.table, pairs, conditions=["w/o", "w/ Mless"], shade_condition="w/ Mless",
                                      title=f"{name}: average attention received, with vs without Mless filler"),
            condition_change_figure(changes, title=f"{name}: how much each filler changes each head"),
        ],
        tables={"attention_received": shown.reset_index(drop=True), "condition_changes": changes},
        data={"study": {"model": model_label(model), "question": res.question, "question_source": source,
                        "layers": layers, "heads_shown": [head_label(a, b) for a, b in pairs],
                        "filler_spans": spans, "indexing": "0-based layers and heads (L0H13 = paper's layer 1 head 14)",
                        "prompts": res.prompts_json()}},
    )


def filler_vs_random_section(model, question: str, setup: FillerSetup, layer: int, head: int) -> Section:
    """The Mless filler against a random sentence of the same token count, at one head."""
    name = html.escape(model_label(model))
    fr = filler_vs_random([model], question, layer=layer, head=head, setup=setup)
    label = head_label(layer, head)
    return Section(
        title="Filler tokens vs a random sentence of the same length",
        intro=(
            f"<p>Model: <b>{name}</b>, head {label} (the layer-0 head whose attention "
            "changes most with Mless). The Mless filler against a random sentence of real words with the same "
            "number of tokens at the same place: both prompts have the same length, and the shaded band is the "
            "filler / sentence span. The figure takes a list of models and draws one panel per model; this "
            f"report has one. {INDEX_NOTE_HTML}</p>"
        ),
        figures=[filler_vs_random_figure(fr.table, title=f"Mless filler vs random sentence at {label}")],
        tables={"filler_vs_random": fr.table},
        data={"study": {"model": model_label(model), "layer": layer, "head": head, "spans": fr.spans,
                        "random_sentence": {m: p["random sentence"].pieces.get("filler")
                                            for m, p in fr.prompts.items()}}},
    )


def token_class_section(model, setup: FillerSetup, quick: bool) -> Section:
    """Attention per token class on an ASCII grid, with and without the Mless filler."""
    name = html.escape(model_label(model))
    n_layers = int(model.cfg.n_layers)
    grid = ascii_grid(4, 8, seed=0) if quick else ascii_grid(8, 16, seed=0)
    grid_q = "Count the # symbols in this grid:\n" + grid
    grid_prompts = {condition_label(c): setup.condition(c).prompt_builder(model)(grid_q) for c in ("w/o", "w/ Mless")}
    c_layers = sorted({0, min(1, n_layers - 1)}) if quick else class_layers(model)
    classes = compare_token_class_attention({g: (model, p) for g, p in grid_prompts.items()}, c_layers)
    return Section(
        title="Attention per token class (ASCII grid), with vs without filler",
        intro=(
            f"<p>Model: <b>{name}</b>. Prompt: an ASCII grid of <code>#</code>, <code>*</code> and spaces, asked "
            "with and without the Mless filler. Each bar is the share of an average query's attention (mean over "
            "query positions and heads) that lands on key tokens of each class at that layer; 'other' is the "
            "rest (chat scaffolding, system prompt, instruction, the filler's '/' tokens). A token is in a class "
            "when all its non-space characters are that symbol; tokens made only of spaces or newlines are "
            f"'whitespace'. Layers {', '.join(f'L{x}' for x in c_layers)}. {INDEX_NOTE_HTML}</p>"
            f"<details><summary>Grid</summary><pre>{html.escape(grid)}</pre></details>"
        ),
        figures=[token_class_figure(classes, title=f"{name}: attention per token class by layer (ASCII grid)")],
        tables={"token_class_attention": classes},
        data={"study": {"model": model_label(model), "layers": c_layers,
                        "prompts": {g: prompt_json(p) for g, p in grid_prompts.items()}}},
    )


def attention_view_section(model, res: AttentionReceived) -> Section:
    """Every head of layer 0 on the Mless prompt, as an interactive circuitsvis view."""
    name = html.escape(model_label(model))
    view_prompt = res.prompts["w/ Mless"]
    mless_span = res.filled_span("w/ Mless")
    view = attention_view_pattern(model, view_prompt, 0)
    return Section(
        title="Layer 0 attention, interactive (Mless prompt)",
        intro=(
            f"<p>Model: <b>{name}</b>. Every head of layer 0 on the Mless prompt (circuitsvis: pick a head, hover "
            "a token to see where it attends). Tokens of the filler span are shown as «/». The pattern is saved "
            f"rounded to 4 decimals. {INDEX_NOTE_HTML}</p>"
        ),
        html=[attention_view_html(view, view_prompt.str_tokens, layer=0, span=mless_span)],
        data={"attention_L0": {"model": model_label(model), "layer": 0, "filler_span": list(mless_span),
                               "str_tokens": view_prompt.str_tokens, "pattern": view.tolist()}},
    )
