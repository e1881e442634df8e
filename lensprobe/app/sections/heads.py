"""The demo report's head-ablation sections: a sweep of every head, the paper's "average attention on
head H", single ablations of the chosen head, and activation patching of layer 0."""

import html

from lensprobe.app.sections.filler import demo_question
from lensprobe.core.hooks.heads import head_label
from lensprobe.core.lazy import pandas
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import Prompt
from lensprobe.experiments.patching import patch
from lensprobe.experiments.sweep import ablation_sweep
from lensprobe.interventions.ablation import ablate_heads, ablate_kv_group
from lensprobe.studies.filler import FillerSetup, attention_received_by_condition, condition_prompts
from lensprobe.studies.heads import ablation_effect, head_attention_over_generation
from lensprobe.viz import head_attention_figure, next_token_figure, patch_figure, sweep_heatmap
from lensprobe.viz.report import Section
from lensprobe.viz.style import condition_label

PATCH_HOOKS = ("blocks.0.hook_resid_post", "blocks.0.attn.hook_z", "blocks.0.hook_mlp_out")


PATCH_SEGMENTS = ("system", "question", "assistant_prefix")


NOTE = ("Layer and head indices are 0-based, as in TransformerLens: <b>L0H13</b> is the papers' "
        "\"layer 1, head 14\".")


def build_section(model, *, quick: bool = False, progress: bool = False) -> list:
    """The head-ablation sections of the demo report (registered in ``lensprobe.app.demo``).

    A zero-ablation sweep of every head (``quick``: the first two layers) measuring the
    next-token entropy on a MATH question without and with the Mless filler; the layer-0
    head whose ablation moves the entropy most is then shown as the paper's "average
    attention on head H" under None / Mless / Mful, and over prompt + generated tokens;
    single ablations of that head (zero, mean, its KV group); and activation patching of
    layer 0 from the Mless run into the plain run, site by site. ``progress``: the sweep's progress bar.
    """
    question, source = demo_question(quick)
    setup = FillerSetup(conditions=("w/o", "w/ Mless", "w/ Mful"))
    prompts = condition_prompts(model, question, setup)
    s1, head = sweep_section(model, prompts, source, quick, progress)
    return [s1, head_attention_section(model, question, setup, (0, head), quick),
            single_ablation_section(model, prompts, (0, head)), patching_section(model, prompts)]


def sweep_section(model, prompts: dict[str, Prompt], source: str, quick: bool,
                  progress: bool = False) -> tuple[Section, int]:
    """Zero-ablate every head (``quick``: the first two layers) on the w/o and Mless prompts: the
    entropy change per head, and the layer-0 head that moves it most."""
    name = model_label(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    swept = "all" if not quick else [(layer, h) for layer in range(min(2, n_layers)) for h in range(n_heads)]
    sweep = ablation_sweep(model, [prompts["w/o"], prompts["w/ Mless"]], "entropy", heads=swept,
                           batch_size=32, progress=progress, rank=0, world_size=1)  # the demo never shards
    per_prompt = {"w/o": sweep.prompt(0), "w/ Mless": sweep.prompt(1)}
    layer0 = sweep.to_dataframe().query("layer == 0").groupby("head")["change"].mean()
    head = int(layer0.abs().idxmax())
    label = head_label(0, head)
    section = Section(
        title="Head ablation sweep: which heads move the next-token entropy",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b> ({n_layers} layers x {n_heads} query heads, {n_kv} KV heads). "
            f"Prompt: {html.escape(source)} with the paper's MATH system prompt, without filler and with the "
            "Mless filler (\"/\" x 55). Every head was zero-ablated on its own at "
            "<code>blocks.{l}.attn.hook_z</code> (per query head, so grouped-query attention is handled "
            "correctly), and the change in next-token entropy at the last prompt position is shown "
            "(ablated - baseline, nats; red: the model becomes less certain). One forward pass serves 32 "
            f"ablated heads (a different head in each batch row). {NOTE}</p>"
            f"<p>Baseline entropy: {sweep.baseline[0]:.3f} nats without filler, {sweep.baseline[1]:.3f} with "
            f"Mless. The paper's \"head 14\" does not exist in a {n_heads}-head model, so the head studied "
            f"below is the layer-0 head whose ablation changes the entropy most: <b>{label}</b> "
            f"(mean change {layer0[head]:+.4f} nats).</p>"
        ),
        figures=[sweep_heatmap(per_prompt[c], title=f"Entropy change when ablating each head ({condition_label(c)})")
                 for c in per_prompt],
        tables={"sweep_table_without_filler": per_prompt["w/o"].table.reset_index(),
                "sweep_table_mless": per_prompt["w/ Mless"].table.reset_index(),
                "sweep_long": sweep.to_dataframe(), "top_heads": sweep.top(10)},
        data={"model": name, "metric": "next-token entropy (nats) at the last prompt position",
              "method": "zero", "baseline": {"w/o": float(sweep.baseline[0]), "w/ Mless": float(sweep.baseline[1])},
              "heads_swept": len(sweep.heads), "chosen_head": label,
              "indexing": "0-based layers and heads (L0H13 = paper's layer 1 head 14)"},
    )
    return section, head


def head_attention_section(model, question: str, setup: FillerSetup, pair: tuple[int, int], quick: bool) -> Section:
    """The paper's "average attention on head H" under each condition: over the prompt, then over
    prompt + greedily generated tokens (w/o and Mless)."""
    name = model_label(model)
    layer, head = pair
    label = head_label(layer, head)
    recv = attention_received_by_condition(model, question, layers=[layer], heads=[head], setup=setup)
    n_new = 6 if quick else 48
    over = head_attention_over_generation(model, question, pair, conditions=("w/o", "w/ Mless"),
                                          max_new_tokens=n_new, setup=setup)
    labels = ", ".join(condition_label(c) for c in recv.conditions)
    return Section(
        title=f"Average attention on head {label}, None / Mless / Mful",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b>. The paper's \"average attention on head H\": for each token "
            "position j, the mean attention A[i, j] it receives from the later positions i &gt; j, on head "
            f"{label}. Conditions: {labels} (Mful = \"he\" x 55); positions are aligned by "
            "dropping the filler span, so position k is the same token in every condition. The second figure "
            f"continues over {n_new} greedily generated tokens (KV-cached generation, then one forward pass over "
            "prompt + generated tokens) for w/o filler and Mless; generated tokens may differ between the "
            f"conditions. {NOTE}</p>"
        ),
        figures=[head_attention_figure(recv.table, layer, head, title=f"{name}: average attention on head {label}"),
                 head_attention_figure(over, layer, head,
                                       title=f"{name}: average attention on head {label}, prompt + generated")],
        tables={"head_attention_prompt": recv.table, "head_attention_generation": over},
        data={"model": name, "head": label, "max_new_tokens": n_new,
              "generated_text": {c: "".join(over.loc[(over["condition"] == c)
                                                     & (over["segment"] == "generated"), "token"])
                                 for c in over["condition"].unique()}},
    )


def single_ablation_section(model, prompts: dict[str, Prompt], pair: tuple[int, int]) -> Section:
    """One head ablated three ways (zero, mean over the condition prompts, its KV group) on every
    condition's prompt: entropy, KL and the next tokens."""
    name = model_label(model)
    layer, head = pair
    label = head_label(layer, head)
    n_heads = int(model.cfg.n_heads)
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    group = head // max(n_heads // n_kv, 1)
    ablations = {
        f"zero {label}": ablate_heads([pair]),
        f"mean {label} (over the 3 prompts)": ablate_heads([pair], method="mean", reference=list(prompts.values())),
        f"zero KV group L{layer}KV{group} (its {n_heads // n_kv} query heads)": ablate_kv_group([(layer, group)]),
    }
    rows, effects = [], {}
    for abl_name, abl in ablations.items():
        for c, p in prompts.items():
            eff = ablation_effect(model, p, abl)
            effects[(abl_name, c)] = eff
            rows.append({"ablation": abl_name, "condition": condition_label(c), **eff.summary})
    first = effects[(f"zero {label}", "w/o")]
    return Section(
        title=f"Ablating {label}: next-token change",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b>. Head {label} ablated three ways (zero; its mean output over "
            "the three condition prompts; every query head sharing its key/value head), on each condition's "
            "prompt. Entropy and KL (clean || ablated) in nats at the last prompt position; the figure shows "
            f"the top next tokens without filler, zero-ablated. {NOTE}</p>"
        ),
        figures=[next_token_figure(first, title=f"Next token without filler, {label} zero-ablated")],
        tables={"single_ablations": pandas().DataFrame(rows), "next_tokens_zero_without_filler": first.tokens},
        data={"model": name, "head": label, "kv_group": f"L{layer}KV{group}"},
    )


def patching_section(model, prompts: dict[str, Prompt]) -> Section:
    """Layer-0 activations patched from the Mless run into the plain run, site by site."""
    name = model_label(model)
    res = patch(model, prompts["w/ Mless"], prompts["w/o"], list(PATCH_HOOKS), segments=list(PATCH_SEGMENTS),
                rank=0, world_size=1)
    effect = res.source_value - res.target_value
    return Section(
        title="Activation patching: layer 0 from the Mless run into the plain run",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b>. The plain prompt (no filler) is run with layer-0 activations "
            "copied from the Mless run, one site at a time (hook point x prompt segment; segments are aligned "
            "by name, so the two prompts may differ in length), plus all sites at once. Entropy at the last "
            f"prompt position: {res.target_value:.4f} nats without filler, {res.source_value:.4f} with Mless "
            f"(difference {effect:+.4f}). <code>share</code> = change / that difference: 1 "
            "means the patched site alone carries the whole filler effect on the entropy. Positions before the "
            "filler (the system prompt) cannot differ between the runs, so patching them changes nothing; and "
            "at layer 0 patching the attention output (<code>hook_z</code>) gives the same numbers as patching "
            "the residual stream after the layer, since the token embedding is the same and the MLP recomputes "
            "from it. Both are checks on the patching itself.</p>"
        ),
        figures=[patch_figure(res, title="Layer 0 patched from the Mless run into the plain run (entropy)")],
        tables={"patching": res.to_dataframe()},
        data={"model": name, "hooks": list(PATCH_HOOKS), "segments": list(PATCH_SEGMENTS),
              "entropy_without_filler": res.target_value, "entropy_mless": res.source_value},
    )
