"""The demo report's evaluation sections: built-in arithmetic problems (graded on the last number of
the answer) and level-1 MATH-500 problems (graded on ``\\boxed{}``), under w/o, w/ Mless, w/ Mful."""

import html

from lensprobe.app.recipe import list_recipes
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.loading import model_label
from lensprobe.core.prompts.conditions import resolve_conditions
from lensprobe.evals.problems.arithmetic import arithmetic_problems
from lensprobe.evals.problems.load import load_math500, math500_path
from lensprobe.evals.running.harness import evaluate
from lensprobe.interventions.arm import ARM
from lensprobe.viz.eval_report import results_section
from lensprobe.viz.report import Section

SMALL_MODEL_NOTE = (
    "A 135M-parameter model such as SmolLM2-135M-Instruct solves very few MATH problems, even at "
    "level 1: expect accuracies of a few percent with wide, overlapping intervals. This section shows "
    "the harness working end to end; it does not reproduce the paper's gains, which were measured on "
    "1.5B-7B math models over all 500 problems with long generations."
)


__all__ = ["build_arithmetic_section", "build_demo_section", "build_math500_section"]

ARITHMETIC_TITLE = "Arithmetic evaluation (last-number grading): w/o vs w/ Mless vs w/ Mful"
ARITHMETIC_PROBLEMS = 40
ARITHMETIC_MAX_NEW_TOKENS = 48
ARITHMETIC_BATCH = 20


def build_demo_section(model, *, quick: bool = False, progress: bool = False):
    """The demo's evaluation sections: the arithmetic set, then level-1 MATH-500 problems.

    Returns:
        ``[arithmetic section, MATH-500 section]`` (see :func:`build_arithmetic_section` and
        :func:`build_math500_section`).
    """
    return [build_arithmetic_section(model, quick=quick, progress=progress),
            build_math500_section(model, quick=quick, progress=progress)]


def _arithmetic_conditions(model) -> tuple[str, str]:
    """The conditions of the arithmetic run, and a sentence on ARM for the intro."""
    names = "w/o,w/ Mless,w/ Mful"
    try:
        ARM.preset(model)
    except LensprobeError:
        return names, ("ARM is left out: the authors published no ARM preset for this model, and a setting "
                       "chosen here would be a guess.")
    return names + ",ARM,w/ Mless+ARM", "ARM uses the authors' preset for this model (per-row statistics, batched)."


def build_arithmetic_section(model, *, quick: bool = False, progress: bool = False):
    """Built-in arithmetic problems under w/o, w/ Mless, w/ Mful (and ARM when the model has a preset).

    Full: the first ``ARITHMETIC_PROBLEMS`` problems of ``lp.evals.arithmetic_problems(seed=0)``
    (level 1 and 2 alternating), greedy, at most ``ARITHMETIC_MAX_NEW_TOKENS`` new tokens,
    the answer read as the last number of the generation (``extract="last-number"``). Quick:
    2 problems, 8 tokens.

    Measured with SmolLM2-135M-Instruct: 4/40 right without filler (level 1: 3/20, level 2:
    1/20), 4/40 with Mless, 2/40 with Mful (McNemar p = 1.0 and 0.69); 117 of 120 generations
    reach the token limit. About 200 s on two CPU cores shared with other work (load 3.5-4).
    """
    n, tokens = (2, 8) if quick else (ARITHMETIC_PROBLEMS, ARITHMETIC_MAX_NEW_TOKENS)
    names, arm_note = _arithmetic_conditions(model)
    problems = arithmetic_problems(n=n, seed=0)
    rows = evaluate(model, problems, names, max_new_tokens=tokens, batch_size=ARITHMETIC_BATCH,
                    extract="last-number", model_name=model_label(model), progress=progress, rank=0, world_size=1)
    n_conds = rows["condition"].nunique()
    n_eos = int((rows["finish"] == "eos").sum())
    intro = (
        f"<p>The first {len(problems)} problems of lensprobe's built-in arithmetic set "
        "(<code>lp.evals.arithmetic_problems(seed=0)</code>: one-step problems such as \"What is 34 + 26?\" and "
        "two-step ones such as \"What is 8 * 2 + 9?\", alternating; exact integer answers) x "
        f"{n_conds} conditions on <b>{html.escape(model_label(model))}</b>, greedy decoding, at most {tokens} new "
        "tokens, in the chat template with lensprobe's system prompt and the filler between the system prompt and "
        f"the question, as in the MATH-500 section below. {arm_note}</p>"
        "<p>The answer is the <b>last number of the generated text</b> (<code>extract=\"last-number\"</code>, "
        "lm-eval's flexible extraction: thousands separators and a final period dropped), because a model this "
        "small rarely writes <code>\\boxed{}</code>. A generation that states the right result and then keeps "
        f"talking is graded on whatever number it ends with. {n_eos} of {len(rows)} generations ended before the "
        "token limit. With this few problems only a large difference between conditions would show; read the "
        "intervals and the paired McNemar tests before reading the bars.</p>"
    )
    section = results_section(rows, title=ARITHMETIC_TITLE, intro=intro)
    section.tables["answers"] = rows[["condition", "problem_id", "level", "subject", "answer", "prediction",
                                      "math-verify", "finish", "generation"]]
    return section


def build_math500_section(model, *, quick: bool = False, progress: bool = False):
    """The demo's MATH-500 section: level-1 MATH-500 problems under w/o, w/ Mless, w/ Mful.

    Full: 10 level-1 problems x 3 conditions, 128 new tokens, greedy (SmolLM2-135M rarely
    writes a boxed answer at any length: this run shows the harness on the real benchmark, the
    arithmetic section shows a measurable accuracy).
    Quick: 2 problems x 3 conditions, 8 tokens.
    """

    title = "MATH-500 evaluation: w/o vs w/ Mless vs w/ Mful"
    path = math500_path()
    n, tokens = (2, 8) if quick else (DEMO_PROBLEMS, DEMO_MAX_NEW_TOKENS)
    conds = resolve_conditions("w/o,w/ Mless,w/ Mful")
    builders = [c.prompt_builder(model) for c in conds]
    n_ctx = int(model.cfg.n_ctx)
    # the first level-1 problems whose prompts fit the model's context with the new tokens
    def fits(problem) -> bool:
        try:
            return max(len(b(problem.problem)) for b in builders) + tokens <= n_ctx
        except LensprobeError:  # longer than the context already, or refused for what it holds
            return False

    problems = [p for p in load_math500(path, levels=1) if fits(p)][:n]
    if not problems:
        return Section(title=title, intro="<p>No level-1 problem fits this model's context; section skipped.</p>")
    rows = evaluate(model, problems, conds, max_new_tokens=tokens, batch_size=DEMO_BATCH,
                    model_name=model_label(model), progress=progress, rank=0, world_size=1)
    n_boxed = int(rows["prediction"].notna().sum())
    intro = (
        f"<p>{len(problems)} level-1 MATH-500 problems (the first in file order that fit the context) x 3 conditions on "
        f"<b>{html.escape(model_label(model))}</b>, greedy decoding, at most {tokens} new tokens, with the "
        "model's chat template and lensprobe's system prompt (\"Please reason step by step, and put your "
        "final answer within \\boxed{}.\", a cleaned-up form of the authors' instruction) and the filler "
        "between the system prompt and the question (Mless = \"/\" x 55, "
        "Mful = \"he\" x 55). The demo is kept small to run in a few minutes on two CPU cores; "
        "run <code>lensprobe eval</code> for the full set.</p>"
        f"<p class='note'><b>Read this first:</b> {SMALL_MODEL_NOTE} Here {n_boxed} of {len(rows)} "
        "generations contain a <code>\\boxed{...}</code> answer at all; an unboxed answer counts as "
        "wrong. What such a model can do is arithmetic of a step or two, which the section above "
        "measures.</p>"
    )
    section = results_section(rows, title=title, intro=intro + recipes_html())
    sample = rows[["condition", "problem_id", "answer", "prediction", "math-verify", "finish", "generation"]]
    section.tables["answers"] = sample
    return section


def recipes_html() -> str:
    """A paragraph listing the shipped recipes (``lensprobe reproduce``) with their commands."""
    items = "".join(
        f"<li><code>lensprobe reproduce {html.escape(r.name)}</code>: {html.escape(r.title)}</li>"
        for r in list_recipes())
    return (
        "<p><b>Reproducing the papers' tables and figures.</b> Each is a recipe shipped with lensprobe; "
        "<code>lensprobe reproduce RECIPE --model M [--limit N] --out DIR</code> runs one and writes its table "
        "(CSV, Markdown, report page) with the published numbers beside this run's "
        "(<code>lensprobe reproduce --list</code>; docs: <i>Reproducing the papers</i>, "
        f"<code>docs/reproducing.md</code>):</p><ul>{items}</ul>"
    )


DEMO_PROBLEMS = 10
DEMO_MAX_NEW_TOKENS = 128
DEMO_BATCH = 10
