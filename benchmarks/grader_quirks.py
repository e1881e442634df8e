"""How much each quirk of the graders moves accuracy, measured on constructed generations.

For every MATH-500 problem (the copy shipped with lensprobe) this builds generations whose
correctness is known by construction, and reports the share that each grader accepts:

- ``correct \\boxed{answer}``: right; every grader should accept it;
- ``correct answer + bare %``: ``\\boxed{answer%}``, right for a percentage question;
- ``correct answer + unit``: ``\\boxed{answer \\text{ cm}}``;
- ``correct \\fbox{answer}`` and ``correct \\boxed answer`` (no braces);
- ``first character of the answer``: wrong unless the answer is one character long;
- ``no box generated``: wrong; the ``paper-exact`` grader reads the prompt's own box then
  (``\\boxed{}`` in lensprobe's chat prompt, ``\\boxed{{}}`` in the authors' prompt);
- ``an empty box``: ``\\boxed{}``, wrong.

``paper-exact`` grades prompt + generation (here: the authors' prompt, or lensprobe's chat
system prompt, followed by the generation); the others grade the generation's last box
(``lp.evals.extract_boxed``). The difference between a row's rate and its right rate (100% for
the "correct" rows, 0% for the others, except where the answer is one character long) is
what that quirk moves accuracy by at most, on a model that writes such answers.

Usage:
    python benchmarks/grader_quirks.py            # all 500 problems
    python benchmarks/grader_quirks.py --limit 100
"""

import argparse

import lensprobe as lp
from lensprobe.evals.grading.grade import grade_paper_exact

GRADERS = ("math-verify", "paper", "paper-lenient")


def generations(answer: str) -> dict[str, str]:
    return {
        "correct \\boxed{answer}": f"so the answer is $\\boxed{{{answer}}}$.",
        "correct answer + bare %": f"so the answer is $\\boxed{{{answer}%}}$.",
        "correct answer + unit": f"so the answer is $\\boxed{{{answer} \\text{{ cm}}}}$.",
        "correct \\fbox{answer}": f"so the answer is $\\fbox{{{answer}}}$.",
        "correct \\boxed answer (no braces)": f"so the answer is $\\boxed {answer}$.",
        "first character of the answer": f"so the answer is $\\boxed{{{answer[0]}}}$.",
        "no box generated": f"so the answer is {answer}.",
        "an empty box": "so the answer is $\\boxed{}$.",
    }


def verdicts(prompt_text: str, generation: str, answer: str) -> dict[str, bool]:
    prediction = lp.evals.extract_boxed(generation)
    out = {g: lp.grade(prediction, answer, method="math-verify" if g == "math-verify" else "paper",
                       lenient=g == "paper-lenient") for g in GRADERS}
    out["paper-exact (authors' prompt)"] = grade_paper_exact(lp.PAPER_SYSTEM_PROMPT + prompt_text + generation,
                                                             answer)
    out["paper-exact (chat prompt)"] = grade_paper_exact(lp.MATH_SYSTEM_PROMPT + prompt_text + generation, answer)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N problems (default: all 500)")
    args = parser.parse_args()
    problems = lp.load_math500(limit=args.limit) if args.limit else lp.load_math500()
    kinds = list(generations("x"))
    columns = [*GRADERS, "paper-exact (authors' prompt)", "paper-exact (chat prompt)"]
    counts = {k: dict.fromkeys(columns, 0) for k in kinds}
    for p in problems:
        for kind, text in generations(p.answer).items():
            for grader, ok in verdicts(p.problem, text, p.answer).items():
                counts[kind][grader] += bool(ok)
    n = len(problems)
    one_char = sum(len(p.answer.strip()) == 1 for p in problems)
    print(f"{n} MATH-500 problems ({one_char} with a one-character answer); share accepted per grader\n")
    print("| generation | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for kind in kinds:
        print(f"| {kind} | " + " | ".join(f"{counts[kind][c] / n:.1%}" for c in columns) + " |")


if __name__ == "__main__":
    main()
