"""The latent-thinking study: entropy and attention onto thinking tokens per generation step.

Reproduces the analysis of LT-Tuning (arXiv 2602.10229) on any TransformerLens model: the
same prompts are generated under several thinking settings (latent fusion, Coconut,
Soft-Thinking, pause tokens, no thinking) with one schedule, and every step's next-token
entropy and attention proportion onto the thinking positions are traced
(:func:`lensprobe.trace_generation`). The figure shows the mean over prompts (or samples)
with a shaded band.

On a model that was never trained with a thinking token (such as the embedded
SmolLM2-135M-Instruct) the token is added with the mean input embedding
(:func:`lensprobe.add_thinking_token`) and a fixed schedule decides when to think: this shows
the instrument at work, not the paper's trained behaviour.

Example:
    >>> import lensprobe as lp
    >>> from lensprobe.thinking_study import compare_thinking, THINKING_SETTINGS
    >>> traces = compare_thinking(model, [prompt], ["fusion", "pause", "none"], max_new_tokens=128,
    ...                           think_when=lp.schedule.every(8))
    >>> fig = lp.viz.generation_trace_figure(lp.trace_summary(traces))
"""

import copy
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from lensprobe.errors import LensprobeError
from lensprobe.generation import trace_generation
from lensprobe.prompts import MATH_SYSTEM_PROMPT, build_prompt
from lensprobe.schedule import at, emitted, entropy_above, every, first, never
from lensprobe.thinking import THINKING_TOKEN, LatentFusion, Pause, add_thinking_token
from lensprobe.trace import GenerationTrace, trace_summary

THINKING_SETTINGS = ("fusion", "coconut", "soft", "pause", "none")
"""Names of the thinking settings: LT-Tuning fusion, Coconut, Soft-Thinking, pause tokens, none."""

SETTING_LABELS = {
    "fusion": "LatentFusion (alpha=0.6)",
    "coconut": "Coconut (alpha=1)",
    "soft": "Soft-Thinking (alpha=0)",
    "pause": "Pause",
    "none": "no thinking",
}

NOT_TRAINED_NOTE = (
    "SmolLM2-135M-Instruct was never trained to emit or read a <code>&lt;thinking&gt;</code> token. "
    "lensprobe adds the token with the mean input embedding, and a fixed schedule (not the model) "
    "decides when to think. These curves show what the tracing measures on an untrained model; they "
    "do not reproduce the paper's trained LT-Tuning model."
)


def thinking_setting(name: str, *, alpha: float = 0.6, top_p: float = 0.9, temperature: float = 1.0,
                     token: str = THINKING_TOKEN) -> LatentFusion | Pause | None:
    """The thinking input of a setting name (see :data:`THINKING_SETTINGS`).

    Example:
        >>> thinking_setting("soft")
        LatentFusion(alpha=0.0, top_p=0.9, temperature=1.0, token='<thinking>')
    """
    if name == "fusion":
        return LatentFusion(alpha=alpha, top_p=top_p, temperature=temperature, token=token)
    if name == "coconut":
        return LatentFusion(alpha=1.0, top_p=top_p, temperature=temperature, token=token)
    if name == "soft":
        return LatentFusion(alpha=0.0, top_p=top_p, temperature=temperature, token=token)
    if name == "pause":
        return Pause(token=token)
    if name == "none":
        return None
    raise LensprobeError(f"unknown thinking setting {name!r}: choose from {', '.join(THINKING_SETTINGS)}.")


def parse_schedule(text: str):
    """A schedule from text: ``every:8``, ``first:4``, ``at:0,1,5``, ``entropy:2.5``, ``emitted``,
    ``never``, or several joined with ``+`` (any of them).

    Example:
        >>> parse_schedule("first:4+every:16")
    """
    if not isinstance(text, str) or not text.strip():
        raise LensprobeError("empty schedule: use e.g. 'every:8', 'first:4', 'entropy:2.5' or 'emitted'.")
    rules = []
    for part in text.replace(" ", "").split("+"):
        name, _, arg = part.partition(":")
        try:
            if name == "every":
                rules.append(every(int(arg)))
            elif name == "first":
                rules.append(first(int(arg)))
            elif name == "at":
                rules.append(at([int(v) for v in arg.split(",") if v]))
            elif name == "entropy":
                rules.append(entropy_above(float(arg)))
            elif name == "emitted" and not arg:
                rules.append(emitted())
            elif name == "never" and not arg:
                rules.append(never())
            else:
                raise ValueError(part)
        except ValueError:
            raise LensprobeError(
                f"cannot read schedule part {part!r}: use every:N, first:K, at:S1,S2, entropy:NATS, emitted "
                "or never, joined with '+'."
            ) from None
    rule = rules[0]
    for r in rules[1:]:
        rule = rule | r
    return rule


def with_thinking_token(model, token: str = THINKING_TOKEN):
    """The model itself if its vocabulary holds ``token``, else a copy with the token added."""
    ids = model.tokenizer.encode(token, add_special_tokens=False)
    if len(ids) == 1 and model.tokenizer.decode(ids) == token:
        return model
    model = copy.deepcopy(model)
    add_thinking_token(model, token)
    return model


def compare_thinking(model, prompts, settings: Sequence[str] | Mapping[str, object], *, max_new_tokens: int,
                     think_when=None, track: Mapping | None = None, n_samples: int = 1, do_sample: bool = False,
                     temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                     stop_at_eos: bool = True, layers=None, progress: bool = False) -> dict[str, GenerationTrace]:
    """Trace the same prompts under several thinking settings with one schedule.

    Args:
        model: a model whose vocabulary holds the thinking token (see :func:`with_thinking_token`).
        prompts: one prompt or a list (batched with left padding).
        settings: names from :data:`THINKING_SETTINGS`, or ``{label: LatentFusion | Pause | None}``.
        max_new_tokens, think_when, n_samples, do_sample, temperature, top_p, seed, stop_at_eos,
            layers: as in :func:`lensprobe.trace_generation`. Default schedule: ``every(8)``.
        track: extra tracked sets; ``"thinking"`` is added for the thinking settings.
        progress: a progress bar (tokens per second) per setting.

    Returns:
        Setting label -> trace, in the order given.
    """
    if not isinstance(settings, Mapping):
        settings = {SETTING_LABELS.get(s, s): thinking_setting(s) for s in settings}
    think_when = every(8) if think_when is None else think_when
    out = {}
    for label, thinking in settings.items():
        out[label] = trace_generation(
            model, prompts, max_new_tokens=max_new_tokens, track=dict(track or {}), thinking=thinking,
            think_when=think_when if thinking is not None else None, n_samples=n_samples, do_sample=do_sample,
            temperature=temperature, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, layers=layers,
            progress=label if progress else False)
    return out


def texts_table(traces: Mapping[str, GenerationTrace], max_chars: int = 400):
    """Generated texts per setting and row (the thinking token shown as ``<thinking>``)."""
    import pandas as pd

    rows = []
    for label, tr in traces.items():
        for r in range(tr.n_rows):
            rows.append({"setting": label, "prompt": tr.prompt_index[r], "sample": tr.sample_index[r],
                         "tokens": tr.lengths[r], "thinking_steps": int(tr.thinking_rows[r].sum()),
                         "finish": tr.finish_reasons[r], "text": tr.texts[r][:max_chars]})
    return pd.DataFrame(rows)


# ----- the demo section -------------------------------------------------------------------
DEMO_PROBLEMS = 4
DEMO_STEPS = 128
DEMO_SCHEDULE = "every:8"


def build_demo_section(model, *, quick: bool = False):
    """The demo's latent-thinking section: a few MATH-500 problems under fusion, pause, none.

    Full: 4 level-1 MATH-500 problems (the shortest prompts), 128 steps (the paper shows 400),
    greedy, schedule ``every:8``, generation stops at the end-of-sequence token (rows that stop
    leave the mean). Quick: 1 problem, 8 steps.
    """
    from lensprobe.evals.data import load_math500, local_math500_path
    from lensprobe.filler_study import model_label
    from lensprobe.report import Section
    from lensprobe.viz.trace import generation_trace_figure

    title = "Latent thinking tokens: entropy and attention onto <thinking> per generation step"
    n_problems, steps = (1, 8) if quick else (DEMO_PROBLEMS, DEMO_STEPS)
    path = local_math500_path()
    if path is not None:
        problems = load_math500(path, levels=1)
        questions = sorted((p.problem for p in problems), key=len)[: max(n_problems * 3, n_problems)]
        source = "level-1 MATH-500 problems (the shortest)"
    else:
        questions = ["What is $3 + 4 \\cdot 2$?", "Compute $\\sqrt{49}$.", "What is $15\\%$ of $60$?",
                     "Solve for $x$: $2x + 3 = 11$."]
        source = "MATH-style problems (MATH-500 was not found locally; set LENSPROBE_MATH500)"
    model_t = with_thinking_token(model)
    n_ctx = int(model_t.cfg.n_ctx)
    prompts = [build_prompt(model_t, q, system=MATH_SYSTEM_PROMPT) for q in questions]
    prompts = [p for p in prompts if len(p) + steps <= n_ctx][:n_problems]
    if not prompts:
        return Section(title=title, intro="<p>No problem fits this model's context; section skipped.</p>")
    rule = parse_schedule(DEMO_SCHEDULE)
    traces = compare_thinking(model_t, prompts, ["fusion", "pause", "none"], max_new_tokens=steps,
                              think_when=rule, track={"system": "system", "question": "question"})
    summary = trace_summary(traces, track="thinking", band="std", smooth=1 if quick else 5)
    fig = generation_trace_figure(
        summary, title=f"{model_label(model)}: {len(prompts)} MATH-500 problems, mean ± std across problems",
        band_label=f"band: ± 1 std across {len(prompts)} problems")
    name = html.escape(model_label(model))
    intro = (
        f"<p>{len(prompts)} {html.escape(source)} on <b>{name}</b>, greedy decoding, {steps} generation "
        f"steps per problem{' (the paper shows 400; fewer here to keep the demo short)' if steps < 400 else ''}, "
        "the paper's MATH system prompt. Three settings share one fixed schedule: every 8th step is a "
        "thinking step (steps 7, 15, 23, ...; <code>every:8</code>). "
        "<b>LatentFusion</b> feeds <code>0.6·h + 0.4·Σ p̃(w)E(w)</code> (top-p 0.9, thinking token masked) "
        "at each thinking position, <b>Pause</b> feeds the thinking token's own embedding, "
        "<b>no thinking</b> decodes normally. Panel (a): next-token entropy per step (nats); panel (b): "
        "attention proportion from the newest query onto all thinking positions, mean over layers and "
        "heads. Lines are the mean across the problems still generating at that step (a row leaves after its "
        "end-of-sequence token), bands ± 1 standard deviation, smoothed over 5 steps. "
        "Step 0 is the last prompt position (its query predicts the first new token).</p>"
        f"<p class='note'><b>Read this first:</b> {NOT_TRAINED_NOTE}</p>"
    )
    texts = texts_table(traces)
    data = {label: {"mean_entropy": float(tr.entropy_rows.nanmean()),
                    "thinking_steps_per_row": [int(x) for x in tr.thinking_rows.sum(1)],
                    "mean_attention": {s: float(v.nanmean()) for s, v in tr.attention_rows.items()}}
            for label, tr in traces.items()}
    data["settings"] = {"steps": steps, "schedule": DEMO_SCHEDULE, "problems": len(prompts),
                        "alpha": 0.6, "top_p": 0.9, "decoding": "greedy"}
    return Section(title=title, intro=intro, figures=[fig], tables={"per_step": summary, "texts": texts},
                   data={"summary": data})


# ----- the CLI subcommand -----------------------------------------------------------------
def add_trace(subparsers) -> None:
    """Register ``lensprobe trace``."""
    p = subparsers.add_parser(
        "trace", help="trace entropy and attention onto thinking tokens per generation step",
        description="Generate from a question under one or more thinking settings (LatentFusion, Coconut, "
                    "Soft-Thinking, pause tokens, none) with a KV cache, recording per step the next-token "
                    "entropy and the attention proportion from the newest query onto the thinking positions "
                    "(and other tracked sets), per layer and head. Writes one trace file per setting, the "
                    "per-step summary as CSV and the two-panel figure as HTML. Step 0 is the last prompt "
                    "position. Layers and heads are 0-based.")
    p.add_argument("--model", default=None, help="model path (.gguf or HF folder) or hub name; default: the "
                                                 "embedded SmolLM2-135M-Instruct; 'tiny': a tiny random test model")
    p.add_argument("--question", required=True, help="the question text")
    p.add_argument("--system", default=MATH_SYSTEM_PROMPT, help="system prompt (default: the paper's MATH prompt)")
    p.add_argument("--no-system", action="store_true", help="no system prompt")
    p.add_argument("--max-new-tokens", type=int, default=400, help="generation steps (default 400)")
    p.add_argument("--think", default="fusion",
                   help=f"thinking setting(s), comma-separated, from {','.join(THINKING_SETTINGS)} (default fusion)")
    p.add_argument("--schedule", default="every:8",
                   help="when to think: every:N, first:K, at:S1,S2, entropy:NATS, emitted (the model emits the "
                        "token), joined with '+' (default every:8)")
    p.add_argument("--alpha", type=float, default=0.6, help="LatentFusion alpha for --think fusion (default 0.6)")
    p.add_argument("--fusion-top-p", type=float, default=0.9, help="top-p of the latent mixture (default 0.9)")
    p.add_argument("--token", default=THINKING_TOKEN, help="the thinking token (added if missing)")
    p.add_argument("--track", default="system,question",
                   help="extra tracked sets, comma-separated: segment names, 'prompt', 'generated', or one-token "
                        "strings (default system,question)")
    p.add_argument("--samples", type=int, default=1, help="samples per setting (needs --sample for variety)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--smooth", type=int, default=1, help="moving-average window of the figure, in steps")
    p.add_argument("--format", default="parquet", choices=("parquet", "json"), help="trace file format")
    p.add_argument("--out", type=Path, default=Path("lensprobe-trace"), help="output folder")
    p.set_defaults(func=run_trace_cli)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "trace"


def run_trace_cli(args) -> int:
    from tqdm.auto import tqdm

    from lensprobe.evals.cli import load_cli_model
    from lensprobe.filler_study import model_label
    from lensprobe.viz.trace import generation_trace_figure

    names = [s.strip() for s in args.think.split(",") if s.strip()]
    settings = {SETTING_LABELS.get(n, n): thinking_setting(n, alpha=args.alpha, top_p=args.fusion_top_p,
                                                           token=args.token) for n in names}
    if not settings:
        raise LensprobeError(f"--think needs at least one of {', '.join(THINKING_SETTINGS)}.")
    rule = parse_schedule(args.schedule)
    track = {s.strip(): s.strip() for s in args.track.split(",") if s.strip()}
    with tqdm(total=1, desc="loading model", leave=False) as bar:
        model = load_cli_model(args.model)
        bar.update()
    if any(t is not None for t in settings.values()):
        ids = model.tokenizer.encode(args.token, add_special_tokens=False)
        if not (len(ids) == 1 and model.tokenizer.decode(ids) == args.token):
            add_thinking_token(model, args.token)  # this process owns the model
    prompt = build_prompt(model, args.question, system=None if args.no_system else args.system)
    traces = compare_thinking(model, prompt, settings, max_new_tokens=args.max_new_tokens, think_when=rule,
                              track=track, n_samples=args.samples, do_sample=args.sample,
                              temperature=args.temperature, top_p=args.top_p,
                              seed=args.seed if args.sample else None, progress=True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for label, tr in traces.items():
        files.append(tr.save(out / f"trace-{_slug(label)}.{args.format}"))
    summary = trace_summary(traces, track="thinking" if any(t is not None for t in settings.values()) else
                            next(iter(track), None), band="std", smooth=args.smooth)
    csv = out / "summary.csv"
    summary.to_csv(csv, index=False)
    files.append(csv)
    texts = texts_table(traces, max_chars=100_000)
    tcsv = out / "texts.csv"
    texts.to_csv(tcsv, index=False)
    files.append(tcsv)
    band = f"band: ± 1 std across {args.samples} samples" if args.samples > 1 else None
    fig = generation_trace_figure(summary, title=f"{model_label(model)}: {args.question[:60]}", band_label=band)
    fig_path = out / "trace.html"
    fig.write_html(fig_path, include_plotlyjs="directory", full_html=True)
    files.append(fig_path)
    if (out / "plotly.min.js").exists():
        files.append(out / "plotly.min.js")
    print(f"wrote {len(files)} files to {out.resolve()}:")
    for f in files:
        print(f"  {f.name}")
    for label, tr in traces.items():
        print(f"{label}: {tr.lengths[0]} steps, {int(tr.thinking_rows[0].sum())} thinking, "
              f"mean entropy {float(tr.entropy_rows.nanmean()):.3f} nats")
    return 0
