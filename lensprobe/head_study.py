"""Head studies: which heads carry an effect, and where one head's attention goes.

- :func:`head_attention_over_generation`: the paper's "average attention on head H" per
  token position over the prompt *plus generated tokens*, for two conditions (filler span
  dropped, so positions line up);
- :func:`build_section`: the head-ablation section of the demo report (sweep heatmap,
  average attention on the most influential layer-0 head under None / Mless / Mful, the
  same over generation, single ablations and activation patching).

For the prompt alone use :func:`lensprobe.filler_study.attention_received`; both tables
have the same columns and draw with :func:`lensprobe.viz.head_attention_figure`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from lensprobe.errors import LensprobeError
from lensprobe.heads import head_label, resolve_heads
from lensprobe.metrics import average_attention_received

if TYPE_CHECKING:
    import pandas as pd


def _one_head(model, head: Any) -> tuple[int, int]:
    pairs = resolve_heads(model, head)
    if len(pairs) != 1:
        raise LensprobeError(f"pass exactly one head (e.g. 'L0H3'), got {len(pairs)}: {pairs[:4]}...")
    return pairs[0]


def generate_greedy(model, prompts, max_new_tokens: int, *interventions) -> list[list[int]]:
    """Greedily generated token ids after each prompt (KV-cached, batched; stops at EOS), with
    ``interventions`` attached, through :func:`lensprobe.generate`."""
    from lensprobe.generation import generate

    out = generate(model, list(prompts), max_new_tokens=max_new_tokens, interventions=list(interventions))
    return out.generated_ids


def head_attention_over_generation(model, question: str, head: Any, *,
                                   conditions: Sequence[str] = ("none", "meaningless"),
                                   max_new_tokens: int = 48, setup=None,
                                   generated: dict[str, Sequence[int]] | None = None) -> "pd.DataFrame":
    """Average attention on one head per position over prompt + generated tokens, per condition.

    Each condition's prompt is generated from greedily (:func:`lensprobe.generate`: KV-cached,
    the conditions batched with left padding); then one forward pass
    over prompt + generated tokens gives the head's pattern, and
    :func:`~lensprobe.metrics.average_attention_received` the mean attention each position
    receives from the later positions. Positions are aligned by dropping the filler span;
    generated tokens follow the prompt and may differ between conditions (the ``token``
    column says which).

    Args:
        model: a TransformerLens model.
        question: the question text.
        head: one head, e.g. ``"L0H3"`` or ``(0, 3)`` (0-based).
        conditions: filler conditions of :class:`~lensprobe.filler_study.FillerSetup`
            (``"none"``, ``"meaningless"``, ``"meaningful"``, ``"random"``).
        max_new_tokens: tokens to generate per condition.
        setup: a :class:`~lensprobe.filler_study.FillerSetup` for the prompt settings.
        generated: already generated token ids per condition (skips generation).

    Returns:
        A DataFrame with columns ``condition``, ``layer``, ``head``, ``head_label``,
        ``position``, ``aligned_pos``, ``token``, ``segment`` (``"generated"`` after the
        prompt) and ``attention``.

    Example:
        >>> t = head_attention_over_generation(model, "What is 12+7?", "L0H3", max_new_tokens=32)
        >>> fig = lp.viz.head_attention_figure(t, 0, 3)
    """
    import pandas as pd

    from lensprobe.filler_study import FillerSetup, aligned_positions, condition_prompts
    from lensprobe.run import attention_patterns

    layer, h = _one_head(model, head)
    base = setup or FillerSetup()
    setup = FillerSetup(conditions=tuple(conditions), system=base.system, count=base.count, symbol=base.symbol,
                        word=base.word, seed=base.seed, placement=base.placement, chat=base.chat)
    prompts = condition_prompts(model, question, setup)
    todo = [c for c in prompts if not (generated and c in generated)]
    gen = dict(generated or {})
    if todo:
        gen.update(zip(todo, generate_greedy(model, [prompts[c] for c in todo], max_new_tokens), strict=True))
    frames = []
    for cond, prompt in prompts.items():
        new = [int(t) for t in gen[cond]]
        tokens = torch.cat([prompt.tokens, torch.tensor([new], dtype=prompt.tokens.dtype)], dim=1)
        pattern = attention_patterns(model, tokens, [layer])[layer][h]
        recv = average_attention_received(pattern.float()).cpu().tolist()
        n = len(prompt)
        kept = aligned_positions(prompt)
        aligned: list[Any] = [pd.NA] * (n + len(new))
        for k, pos in enumerate(kept):
            aligned[pos] = k
        for k in range(len(new)):
            aligned[n + k] = len(kept) + k
        str_new = [model.tokenizer.decode([t]) for t in new]
        frames.append(pd.DataFrame({
            "condition": cond, "layer": layer, "head": h, "head_label": head_label(layer, h),
            "position": range(n + len(new)), "aligned_pos": pd.array(aligned, dtype="Int64"),
            "token": list(prompt.str_tokens) + str_new,
            "segment": [prompt.segment_of(p) for p in range(n)] + ["generated"] * len(new),
            "attention": recv,
        }))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class AblationEffect:
    """How an intervention changes the next-token prediction at the last prompt position.

    Attributes:
        summary: ``entropy_clean``, ``entropy_ablated``, ``entropy_change`` (nats),
            ``kl`` (KL(clean || ablated), nats), ``max_abs_logit_change``, ``top_token_clean``,
            ``top_token_ablated``.
        tokens: one row per token among the top ``k`` of either run: ``token``, ``token_id``,
            ``p_clean``, ``p_ablated``, ``logit_clean``, ``logit_ablated``, ``logit_change``.
    """

    summary: dict[str, Any]
    tokens: "pd.DataFrame"


def ablation_effect(model, prompt, *interventions, top_k: int = 10) -> AblationEffect:
    """Compare the next-token distribution at the last prompt position with and without ``interventions``.

    Example:
        >>> eff = ablation_effect(model, prompt, lp.ablate_heads("L0H3"))
        >>> eff.summary["entropy_change"], eff.tokens.head()
    """
    import pandas as pd

    from lensprobe.measures import run_logits
    from lensprobe.metrics import entropy
    from lensprobe.run import as_tokens

    tokens = as_tokens(model, prompt)
    clean = run_logits(model, tokens, 1)[0, -1].float()
    after = run_logits(model, tokens, 1, *interventions)[0, -1].float()
    logp_c, logp_a = torch.log_softmax(clean, -1), torch.log_softmax(after, -1)
    ids = sorted(set(clean.topk(top_k).indices.tolist()) | set(after.topk(top_k).indices.tolist()),
                 key=lambda i: -float(logp_c[i]))
    decode = model.tokenizer.decode
    df = pd.DataFrame({
        "token": [decode([i]) for i in ids], "token_id": ids,
        "p_clean": [float(logp_c[i].exp()) for i in ids], "p_ablated": [float(logp_a[i].exp()) for i in ids],
        "logit_clean": [float(clean[i]) for i in ids], "logit_ablated": [float(after[i]) for i in ids],
    })
    df["logit_change"] = df["logit_ablated"] - df["logit_clean"]
    e_c, e_a = float(entropy(clean)), float(entropy(after))
    summary = {
        "entropy_clean": e_c, "entropy_ablated": e_a, "entropy_change": e_a - e_c,
        "kl": float((logp_c.exp() * (logp_c - logp_a)).sum()),
        "max_abs_logit_change": float((after - clean).abs().max()),
        "top_token_clean": decode([int(clean.argmax())]), "top_token_ablated": decode([int(after.argmax())]),
    }
    return AblationEffect(summary, df)


# ---------------------------------------------------------------------------------------
# Report section (the demo)

PATCH_HOOKS = ("blocks.0.hook_resid_post", "blocks.0.attn.hook_z", "blocks.0.hook_mlp_out")
PATCH_SEGMENTS = ("system", "question", "assistant_prefix")


def build_section(model, *, quick: bool = False) -> list:
    """The head-ablation sections of the demo report (registered in ``lensprobe.demo``).

    A zero-ablation sweep of every head (``quick``: the first two layers) measuring the
    next-token entropy on a MATH question without and with the Mless filler; the layer-0
    head whose ablation moves the entropy most is then shown as the paper's "average
    attention on head H" under None / Mless / Mful, and over prompt + generated tokens;
    single ablations of that head (zero, mean, its KV group); and activation patching of
    layer 0 from the Mless run into the plain run, site by site.
    """
    import html

    import pandas as pd

    from lensprobe.ablation import ablate_heads, ablate_kv_group
    from lensprobe.filler_study import (
        CONDITION_LABELS,
        FillerSetup,
        attention_received,
        condition_prompts,
        demo_question,
        model_label,
    )
    from lensprobe.patching import patch
    from lensprobe.report import Section
    from lensprobe.sweep import ablation_sweep
    from lensprobe.viz import head_attention_figure, next_token_figure, patch_figure, sweep_heatmap

    name = model_label(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    question, source = demo_question(quick)
    setup = FillerSetup(conditions=("none", "meaningless", "meaningful"))
    prompts = condition_prompts(model, question, setup)
    labels = {c: CONDITION_LABELS.get(c, c) for c in prompts}
    note = ("Layer and head indices are 0-based, as in TransformerLens: <b>L0H13</b> is the papers' "
            "\"layer 1, head 14\".")

    # 1. sweep
    swept = "all" if not quick else [(layer, h) for layer in range(min(2, n_layers)) for h in range(n_heads)]
    sweep = ablation_sweep(model, [prompts["none"], prompts["meaningless"]], "entropy", heads=swept,
                           batch_size=32, progress=False)
    per_prompt = {"none": sweep.prompt(0), "meaningless": sweep.prompt(1)}
    layer0 = sweep.to_dataframe().query("layer == 0").groupby("head")["change"].mean()
    head = int(layer0.abs().idxmax())
    layer = 0
    label = head_label(layer, head)
    top = sweep.top(10)
    s1 = Section(
        title="Head ablation sweep: which heads move the next-token entropy",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b> ({n_layers} layers x {n_heads} query heads, {n_kv} KV heads). "
            f"Prompt: {html.escape(source)} with the paper's MATH system prompt, without filler and with the "
            "Mless filler (\"/\" x 55). Every head was zero-ablated on its own at "
            "<code>blocks.{l}.attn.hook_z</code> (per query head, so grouped-query attention is handled "
            "correctly), and the change in next-token entropy at the last prompt position is shown "
            "(ablated - baseline, nats; red: the model becomes less certain). One forward pass serves 32 "
            f"ablated heads (a different head in each batch row). {note}</p>"
            f"<p>Baseline entropy: {sweep.baseline[0]:.3f} nats without filler, {sweep.baseline[1]:.3f} with "
            f"Mless. The paper's \"head 14\" does not exist in a {n_heads}-head model, so the head studied "
            f"below is the layer-0 head whose ablation changes the entropy most: <b>{label}</b> "
            f"(mean change {layer0[head]:+.4f} nats).</p>"
        ),
        figures=[sweep_heatmap(per_prompt[c], title=f"Entropy change when ablating each head ({labels[c]})")
                 for c in per_prompt],
        tables={"sweep_table_without_filler": per_prompt["none"].table.reset_index(),
                "sweep_table_mless": per_prompt["meaningless"].table.reset_index(),
                "sweep_long": sweep.to_dataframe(), "top_heads": top},
        data={"model": name, "metric": "next-token entropy (nats) at the last prompt position",
              "method": "zero", "baseline": {"none": float(sweep.baseline[0]), "meaningless": float(sweep.baseline[1])},
              "heads_swept": len(sweep.heads), "chosen_head": label,
              "indexing": "0-based layers and heads (L0H13 = paper's layer 1 head 14)"},
    )

    # 2. average attention on head H: prompt, then prompt + generated tokens
    recv = attention_received(model, question, layers=[layer], heads=[head], setup=setup)
    n_new = 6 if quick else 48
    over = head_attention_over_generation(model, question, (layer, head), conditions=("none", "meaningless"),
                                          max_new_tokens=n_new, setup=setup)
    table_prompt = recv.table
    s2 = Section(
        title=f"Average attention on head {label}, None / Mless / Mful",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b>. The paper's \"average attention on head H\": for each token "
            "position j, the mean attention A[i, j] it receives from the later positions i &gt; j, on head "
            f"{label}. Conditions: {', '.join(labels.values())} (Mful = \"he\" x 55); positions are aligned by "
            "dropping the filler span, so position k is the same token in every condition. The second figure "
            f"continues over {n_new} greedily generated tokens (KV-cached generation, then one forward pass over "
            "prompt + generated tokens) for w/o filler and Mless; generated tokens may differ between the "
            f"conditions. {note}</p>"
        ),
        figures=[head_attention_figure(table_prompt, layer, head,
                                       title=f"{name}: average attention on head {label}"),
                 head_attention_figure(over, layer, head,
                                       title=f"{name}: average attention on head {label}, prompt + generated")],
        tables={"head_attention_prompt": table_prompt, "head_attention_generation": over},
        data={"model": name, "head": label, "max_new_tokens": n_new,
              "generated_text": {c: "".join(over.loc[(over["condition"] == c)
                                                     & (over["segment"] == "generated"), "token"])
                                 for c in over["condition"].unique()}},
    )

    # 3. single ablations of H
    group = head // max(n_heads // n_kv, 1)
    ablations = {
        f"zero {label}": ablate_heads([(layer, head)]),
        f"mean {label} (over the 3 prompts)": ablate_heads([(layer, head)], method="mean",
                                                           reference=list(prompts.values())),
        f"zero KV group L{layer}KV{group} (its {n_heads // n_kv} query heads)": ablate_kv_group([(layer, group)]),
    }
    rows, effects = [], {}
    for abl_name, abl in ablations.items():
        for c, p in prompts.items():
            eff = ablation_effect(model, p, abl)
            effects[(abl_name, c)] = eff
            rows.append({"ablation": abl_name, "condition": labels[c], **eff.summary})
    single = pd.DataFrame(rows)
    first = effects[(f"zero {label}", "none")]
    s3 = Section(
        title=f"Ablating {label}: next-token change",
        intro=(
            f"<p>Model: <b>{html.escape(name)}</b>. Head {label} ablated three ways (zero; its mean output over "
            "the three condition prompts; every query head sharing its key/value head), on each condition's "
            "prompt. Entropy and KL (clean || ablated) in nats at the last prompt position; the figure shows "
            f"the top next tokens without filler, zero-ablated. {note}</p>"
        ),
        figures=[next_token_figure(first, title=f"Next token without filler, {label} zero-ablated")],
        tables={"single_ablations": single, "next_tokens_zero_without_filler": first.tokens},
        data={"model": name, "head": label, "kv_group": f"L{layer}KV{group}"},
    )

    # 4. activation patching
    res = patch(model, prompts["meaningless"], prompts["none"], list(PATCH_HOOKS), segments=list(PATCH_SEGMENTS))
    df = res.to_dataframe()
    effect = res.source_value - res.target_value
    s4 = Section(
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
        tables={"patching": df},
        data={"model": name, "hooks": list(PATCH_HOOKS), "segments": list(PATCH_SEGMENTS),
              "entropy_without_filler": res.target_value, "entropy_mless": res.source_value},
    )
    return [s1, s2, s3, s4]


# ---------------------------------------------------------------------------------------
# Command line: `lensprobe ablate` and `lensprobe sweep` (registered in lensprobe.cli)


def _common_prompt_args(p) -> None:
    from pathlib import Path

    from lensprobe.prompts import MATH_SYSTEM_PROMPT

    p.add_argument("--model", default=None, help="model path (.gguf or HF folder) or hub name; "
                                                 "default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--system", default=MATH_SYSTEM_PROMPT, help="system prompt (default: the paper's MATH prompt)")
    p.add_argument("--no-system", action="store_true", help="no system prompt")
    p.add_argument("--filler", default="none", choices=("none", "meaningless", "meaningful"),
                   help="filler between system prompt and question (default: none)")
    p.add_argument("--method", default="zero", choices=("zero", "mean", "resample"), help="ablation method")
    p.add_argument("--reference", action="append", default=None, metavar="TEXT",
                   help="a reference question for --method mean (repeat for several) or resample (once)")
    p.add_argument("--out", type=Path, required=True, help="output folder")


def _prompt_of(model, args, question: str):
    from lensprobe.filler_study import FillerSetup
    from lensprobe.prompts import build_prompt

    setup = FillerSetup(conditions=(args.filler,), system=None if args.no_system else args.system)
    return build_prompt(model, question, system=setup.system, filler=setup.filler(args.filler, model))


def _reference_of(model, args):
    if args.method != "zero" and not args.reference:
        raise LensprobeError(
            f"--method {args.method} needs --reference TEXT: a question whose head outputs are "
            + ("averaged (repeat --reference for several)." if args.method == "mean" else "copied in.")
        )
    if not args.reference:
        return None
    refs = [_prompt_of(model, args, q) for q in args.reference]
    return refs[0] if args.method == "resample" and len(refs) == 1 else refs


def _load(model_name):
    from tqdm.auto import tqdm

    from lensprobe.models import load_model

    with tqdm(total=1, desc="loading model", leave=False) as bar:
        model = load_model(model_name)
        bar.update()
    return model


def _write_fig(fig, path) -> None:
    fig.write_html(path, include_plotlyjs="directory", full_html=True)


def add_ablate_command(subparsers) -> None:
    """Register ``lensprobe ablate``."""
    p = subparsers.add_parser(
        "ablate", help="ablate attention heads: next-token entropy and logit change, attention figures",
        description="Ablate heads at blocks.{l}.attn.hook_z (per query head, GQA-correct) on one question and "
                    "write the next-token entropy and logit change (JSON/CSV, a bar chart) and, per ablated "
                    "head, its average attention per token position. Heads are 0-based: L0H13 is the papers' "
                    "layer 1, head 14.")
    p.add_argument("--heads", required=True, help="heads, e.g. L0H3,L1H2 or H13 (head 13 in every layer)")
    p.add_argument("--question", required=True, help="the question text")
    p.add_argument("--positions", default=None,
                   help="restrict the ablation to a prompt segment (e.g. question) or positions (e.g. 3,4,5)")
    p.add_argument("--top-k", type=int, default=10, help="tokens to list (default 10)")
    _common_prompt_args(p)
    p.set_defaults(func=run_ablate_command)


def run_ablate_command(args) -> int:
    import json

    from lensprobe.ablation import ablate_heads
    from lensprobe.filler_study import FillerSetup, attention_received, model_label, prompt_json
    from lensprobe.report import to_jsonable
    from lensprobe.viz import head_attention_figure, next_token_figure

    model = _load(args.model)
    prompt = _prompt_of(model, args, args.question)
    positions = args.positions
    if positions is not None and all(part.strip().isdigit() for part in positions.split(",")):
        positions = [int(part) for part in positions.split(",")]
    abl = ablate_heads(args.heads, method=args.method, reference=_reference_of(model, args),
                       positions=positions, prompt=prompt)
    pairs = abl.resolve(model)
    effect = ablation_effect(model, prompt, abl, top_k=args.top_k)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "ablation.json", out / "next_tokens.csv", out / "next_tokens.html"]
    files[0].write_text(json.dumps(to_jsonable({
        "model": model_label(model), "heads": [head_label(*hp) for hp in pairs], "method": args.method,
        "positions": args.positions, "filler": args.filler, "prompt": prompt_json(prompt), **effect.summary,
        "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
    }), indent=1), encoding="utf-8")
    effect.tokens.to_csv(files[1], index=False)
    _write_fig(next_token_figure(effect, title=f"Next token, {args.heads} {args.method}-ablated"), files[2])
    conditions = ("none",) if args.filler == "none" else ("none", args.filler)
    setup = FillerSetup(conditions=conditions, system=None if args.no_system else args.system)
    layers = sorted({lay for lay, _ in pairs})
    heads = sorted({h for _, h in pairs})
    recv = attention_received(model, args.question, layers=layers, heads=heads, setup=setup)
    recv.table.to_csv(out / "head_attention.csv", index=False)
    files.append(out / "head_attention.csv")
    for lay, h in pairs:
        path = out / f"attention_{head_label(lay, h)}.html"
        _write_fig(head_attention_figure(recv, lay, h, title=f"Average attention on head {head_label(lay, h)}"),
                   path)
        files.append(path)
    print(f"entropy {effect.summary['entropy_clean']:.4f} -> {effect.summary['entropy_ablated']:.4f} nats "
          f"({effect.summary['entropy_change']:+.4f}); KL {effect.summary['kl']:.4g}; top token "
          f"{effect.summary['top_token_clean']!r} -> {effect.summary['top_token_ablated']!r}")
    print(f"wrote {len(files)} files to {out.resolve()}")
    return 0


def add_sweep_command(subparsers) -> None:
    """Register ``lensprobe sweep``."""
    p = subparsers.add_parser(
        "sweep", help="ablate every head one at a time: [layer, head] table of metric changes",
        description="Ablate each head on its own (batched: one forward serves --batch-size heads) and write "
                    "the [layer, head] table of metric changes as CSV, a heatmap and a JSON summary. Heads "
                    "are 0-based: L0H13 is the papers' layer 1, head 14.")
    p.add_argument("--metric", default="entropy",
                   help="entropy | logprob (needs --answer) | attention:<segment>, e.g. attention:system")
    p.add_argument("--question", action="append", default=None, metavar="TEXT",
                   help="a question (repeat for several; default: a level-1 MATH-500 problem)")
    p.add_argument("--answer", action="append", default=None, metavar="TEXT",
                   help="the answer for --metric logprob (one, or one per --question)")
    p.add_argument("--heads", default="all", help="heads to sweep (default all), e.g. L0H0,L0H1 or H3")
    p.add_argument("--batch-size", type=int, default=32, help="heads per forward pass (default 32)")
    _common_prompt_args(p)
    p.set_defaults(func=run_sweep_command)


def run_sweep_command(args) -> int:
    import json

    from lensprobe.filler_study import demo_question, model_label, prompt_json
    from lensprobe.report import to_jsonable
    from lensprobe.sweep import ablation_sweep
    from lensprobe.viz import sweep_heatmap

    model = _load(args.model)
    resolve_heads(model, args.heads)  # bad heads fail before any work
    questions = args.question or [demo_question()[0]]
    prompts = [_prompt_of(model, args, q) for q in questions]
    answers = None
    if args.answer:
        answers = args.answer[0] if len(args.answer) == 1 else args.answer
    res = ablation_sweep(model, prompts, args.metric, heads=args.heads, method=args.method,
                         reference=_reference_of(model, args), answers=answers, batch_size=args.batch_size,
                         progress=True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    csv = res.to_csv(out / "sweep.csv")
    _write_fig(sweep_heatmap(res), out / "sweep_heatmap.html")
    (out / "sweep.json").write_text(json.dumps(to_jsonable({
        "model": model_label(model), "metric": res.metric, "method": args.method, "filler": args.filler,
        "baseline": res.baseline.tolist(), "heads_swept": len(res.heads),
        "top_heads": res.top(10).to_dict(orient="records"), "prompts": [prompt_json(p) for p in prompts],
        "indexing": "0-based layers and heads (L0H13 = papers' layer 1, head 14)",
    }), indent=1), encoding="utf-8")
    top = res.top(5)
    print("largest changes: " + ", ".join(f"{r.label} {r.change:+.4g}" for r in top.itertuples()))
    print(f"wrote {csv.name}, {csv.stem}_long.csv, sweep_heatmap.html, sweep.json to {out.resolve()}")
    return 0
