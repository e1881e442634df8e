"""``extract_last_number`` (lm-eval's flexible extraction) on strings worked out by hand, and
``evaluate(..., extract=...)`` on the tiny model: the prediction column is the extractor applied to
the generation, and the default keeps the configuration hash of existing folders."""

import json

import pytest

import lensprobe as lp
from lensprobe.core.storage.identity import identity
from lensprobe.evals.grading.extract import extract_answer, extract_boxed, extract_last_number
from lensprobe.evals.running.harness import EvalConfig


@pytest.mark.parametrize(("text", "expected"), [
    ("17 + 25 = 42", "42"),
    ("The answer is 42.", "42"),                      # the sentence's period is not part of the number
    ("so x = -5", "-5"),                              # a sign after a space or "=" is a sign
    ("(-7)", "-7"),
    ("8-5", "5"),                                     # ... after a digit it is a subtraction
    ("x-3", "3"),
    ("\u22124 degrees", "-4"),                        # the Unicode minus
    ("It costs 3.50 dollars", "3.50"),                # decimals kept as written
    ("-0.25", "-0.25"),
    ("about .5 of it", ".5"),
    ("1,234 apples", "1234"),                         # thousands separators removed
    ("a total of $1,234,567.89.", "1234567.89"),
    ("1,2", "2"),                                     # not a separator: a list of two numbers
    ("12,3456", "3456"),
    (r"so $\frac{3}{4}$", "4"),                       # LaTeX: the last number, whatever surrounds it
    (r"\boxed{-12} is it", "-12"),
    (r"$x^{-2}$", "-2"),
    ("7 * 5 = 35.\n\nNow we add 3", "3"),             # the last number, not the right one
])
def test_last_number_on_tricky_strings(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize("text", ["", None, "no digits here", "a minus - sign and a dot ."])
def test_last_number_is_none_without_a_digit(text):
    assert extract_last_number(text) is None


def test_extract_answer_dispatches_and_refuses_unknown_methods():
    text = r"first \boxed{7}, then 8"
    assert extract_answer(text, "boxed") == extract_boxed(text) == "7"
    assert extract_answer(text, "last-number") == extract_last_number(text) == "8"
    with pytest.raises(lp.LensprobeError, match=r"unknown extract='last'.*'boxed', 'last-number'"):
        extract_answer(text, "last")
    with pytest.raises(lp.LensprobeError, match=r"unknown extract='flexible'.*use one of"):
        lp.evaluate(None, [], extract="flexible")


def test_extract_is_in_the_identity_default_included():
    boxed = EvalConfig(max_new_tokens=4)
    assert identity(boxed) == identity(EvalConfig(max_new_tokens=4, extract="boxed"))
    assert identity(boxed)["extract"] == "boxed"
    assert identity(EvalConfig(max_new_tokens=4, extract="last-number")) == {**identity(boxed),
                                                                           "extract": "last-number"}


def test_evaluate_reads_the_answer_with_the_chosen_extractor(tiny, tmp_path):
    problems = lp.evals.arithmetic_problems(n=3, seed=0)
    # the tiny model's gibberish holds digits often enough; generate enough tokens to see some
    flex = lp.evaluate(tiny, problems, "w/o,w/ Mless", out=tmp_path / "flex", max_new_tokens=12,
                       extract="last-number", progress=False, rank=0, world_size=1)
    boxed = lp.evaluate(tiny, problems, "w/o,w/ Mless", out=tmp_path / "boxed", max_new_tokens=12,
                        progress=False, rank=0, world_size=1)
    default = lp.evaluate(tiny, problems, "w/o,w/ Mless", out=tmp_path / "default", max_new_tokens=12,
                          extract="boxed", progress=False, rank=0, world_size=1)
    assert len(flex) == len(boxed) == 6
    assert list(flex["generation"]) == list(boxed["generation"])  # the extractor changes no generation
    for rows, extract in ((flex, extract_last_number), (boxed, extract_boxed)):
        got = [None if p is None or p != p else p for p in rows["prediction"]]
        assert got == [extract(g) for g in rows["generation"]]
    # verdicts follow the prediction: a prediction equal to the answer is right, a missing one wrong
    for _, r in flex.iterrows():
        if r["prediction"] == r["answer"]:
            assert r["math-verify"] and r["paper"]
        if r["prediction"] is None or r["prediction"] != r["prediction"]:
            assert not r["math-verify"] and not r["paper"]
    # the default is recorded: a folder written with extract="boxed" has the hash of one run at the default
    assert set(boxed["config_hash"]) == set(default["config_hash"])
    assert set(flex["config_hash"]) != set(boxed["config_hash"])
    config = json.loads((tmp_path / "flex" / "config.json").read_text(encoding="utf-8"))
    assert "last-number" in json.dumps(config)
    boxed_config = json.loads((tmp_path / "boxed" / "config.json").read_text(encoding="utf-8"))
    assert boxed_config["settings"]["generation"]["extract"] == "boxed"


def test_cli_eval_on_the_arithmetic_set_with_last_number_extraction(tmp_path, capsys):
    from lensprobe.app.cli import main
    from lensprobe.evals.results.folder import load_results

    out = tmp_path / "arith"
    argv = ["eval", "--model", "tiny", "--problems", "arithmetic", "--limit", "3", "--levels", "2",
            "--extract", "last-number", "--conditions", "w/o", "--max-new-tokens", "6", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    rows = load_results(out)
    expected = lp.evals.arithmetic_problems(n=3, seed=0, levels=2)
    assert list(rows["problem_id"]) == [p.id for p in expected]
    assert list(rows["answer"]) == [p.answer for p in expected]
    got = [None if p is None or p != p else p for p in rows["prediction"]]
    assert got == [extract_last_number(g) for g in rows["generation"]]
    assert "last-number" in (out / "config.json").read_text(encoding="utf-8")
    # problem files' options do not apply to a generated set
    assert main(argv[:-3] + ["--subjects", "Algebra", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "--problems arithmetic generates its problems: drop --data and --subjects" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny", "--extract", "flexible", "--out", str(tmp_path / "y")]) == 2
    assert "invalid choice: 'flexible'" in capsys.readouterr().err


def test_the_arithmetic_set_is_drawn_from_the_problem_seed_not_the_generation_seed():
    """``--shuffle-seed`` chooses the problem set (one meaning per flag); ``--seed`` is the generation's."""
    from lensprobe.app.cli import build_parser
    from lensprobe.app.commands.evals import problems_from_args

    def problems(*flags):
        return problems_from_args(build_parser().parse_args(["eval", "--problems", "arithmetic", "--limit", "4", *flags]))

    assert problems() == lp.evals.arithmetic_problems(n=4, seed=0)
    assert problems("--shuffle-seed", "3") == lp.evals.arithmetic_problems(n=4, seed=3) != problems()
    assert problems("--seed", "3") == problems()
