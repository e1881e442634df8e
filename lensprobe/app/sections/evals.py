"""The demo report's evaluation section: level-1 MATH-500 problems under w/o, w/ Mless, w/ Mful."""

import html

from lensprobe.core.conditions import resolve_conditions
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models import model_label
from lensprobe.evals.data import load_math500, math500_path
from lensprobe.evals.harness import evaluate
from lensprobe.viz.eval_report import results_section
from lensprobe.viz.report import Section

SMALL_MODEL_NOTE = (
    "A 135M-parameter model such as SmolLM2-135M-Instruct solves very few MATH problems, even at "
    "level 1: expect accuracies of a few percent with wide, overlapping intervals. This section shows "
    "the harness working end to end; it does not reproduce the paper's gains, which were measured on "
    "1.5B-7B math models over all 500 problems with long generations."
)


def build_demo_section(model, *, quick: bool = False):
    """The demo's evaluation section: level-1 MATH-500 problems under w/o, w/ Mless, w/ Mful.

    Full: 20 level-1 problems x 3 conditions, 128 new tokens, greedy: a few minutes on two
    CPU cores with SmolLM2-135M (SmolLM2-135M rarely writes a boxed answer at any length).
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
        except LensprobeError:  # longer than the context already
            return False

    problems = [p for p in load_math500(path, levels=1) if fits(p)][:n]
    if not problems:
        return Section(title=title, intro="<p>No level-1 problem fits this model's context; section skipped.</p>")
    rows = evaluate(model, problems, conds, max_new_tokens=tokens, batch_size=DEMO_BATCH,
                    model_name=model_label(model), progress=False)
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
        "wrong.</p>"
    )
    section = results_section(rows, title=title, intro=intro)
    sample = rows[["condition", "problem_id", "answer", "prediction", "math-verify", "finish", "generation"]]
    section.tables["answers"] = sample
    return section


DEMO_PROBLEMS = 20
DEMO_MAX_NEW_TOKENS = 128
DEMO_BATCH = 10
