"""The demo report's latent-thinking section: entropy and attention onto ``<thinking>`` per step."""

import html

from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, build_prompt
from lensprobe.evals.problems.load import load_math500, math500_path
from lensprobe.generation.thinking.schedule import parse_schedule
from lensprobe.generation.traces.summary import trace_summary
from lensprobe.studies.thinking import compare_thinking, texts_table, with_thinking_token
from lensprobe.viz.report import Section
from lensprobe.viz.trace import generation_trace_figure

NOT_TRAINED_NOTE = (
    "SmolLM2-135M-Instruct was never trained to emit or read a <code>&lt;thinking&gt;</code> token. "
    "lensprobe adds the token with the mean input embedding, and a fixed schedule (not the model) "
    "decides when to think. These curves show what the tracing measures on an untrained model; they "
    "do not reproduce the paper's trained LT-Tuning model."
)


DEMO_PROBLEMS = 4


DEMO_STEPS = 128


DEMO_SCHEDULE = "every:8"


def build_demo_section(model, *, quick: bool = False, progress: bool = False):
    """The demo's latent-thinking section: a few MATH-500 problems under fusion, pause, none.

    Full: 4 level-1 MATH-500 problems (the shortest prompts), 128 steps (the paper shows 400),
    greedy, schedule ``every:8``, generation stops at the end-of-sequence token (rows that stop
    leave the mean). Quick: 1 problem, 8 steps.
    """

    title = "Latent thinking tokens: entropy and attention onto <thinking> per generation step"
    n_problems, steps = (1, 8) if quick else (DEMO_PROBLEMS, DEMO_STEPS)
    problems = load_math500(math500_path(), levels=1)
    questions = sorted((p.problem for p in problems), key=len)[: max(n_problems * 3, n_problems)]
    source = "level-1 MATH-500 problems (the shortest)"
    model_t = with_thinking_token(model)
    n_ctx = int(model_t.cfg.n_ctx)
    prompts = [build_prompt(model_t, q, system=MATH_SYSTEM_PROMPT) for q in questions]
    prompts = [p for p in prompts if len(p) + steps <= n_ctx][:n_problems]
    if not prompts:
        return Section(title=title, intro="<p>No problem fits this model's context; section skipped.</p>")
    rule = parse_schedule(DEMO_SCHEDULE)
    traces = compare_thinking(model_t, prompts, ["fusion", "pause", "none"], max_new_tokens=steps,
                              think_when=rule, track={"system": "system", "question": "question"},
                              progress=progress)
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
