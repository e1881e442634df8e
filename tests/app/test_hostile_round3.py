"""Hostile input, round three, on the command line: a value a recipe kind ignores, a refusal that named the
wrong cause, and errors that were tracebacks. Each is one line and exit code 2 (before the model loads
where the model is not needed), naming the cause."""

import shlex

import pytest
import torch

from lensprobe.app import common
from lensprobe.app.cli import main
from lensprobe.core.models import testing
from lensprobe.core.models.testing import tiny_model


def run(argv: str, capsys) -> tuple[int, str]:
    rc = main(shlex.split(argv))
    return rc, capsys.readouterr().err


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """Any model load fails the test; the commands run in ``tmp_path``."""
    def refuse(*args, **kwargs):
        raise AssertionError("the CLI loaded a model")

    monkeypatch.setattr(common, "load_model", refuse)
    monkeypatch.setattr(common, "tiny_model", refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "message"), [
    ("reproduce arm-fig-mechanism --model tiny --limit 3 --out r",
     "recipe 'arm-fig-mechanism' draws a figure from fixed inputs and evaluates no problems, so limit would change "
     "nothing"),
    ("reproduce arm-fig-head-attention --model tiny --runs 2 --max-new-tokens 4 --out r",
     "evaluates no problems, so runs and max_new_tokens would change nothing: drop them"),
    ("reproduce arm-table1 --model tiny --quick --out r",
     "recipe 'arm-table1' evaluates problems; quick shortens only a figure recipe's inputs: drop it"),
])
def test_a_setting_the_recipe_kind_ignores_is_refused_before_the_model(argv, message, no_model, capsys):
    rc, err = run(argv, capsys)
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_a_damaged_recipe_record_in_the_out_folder_is_one_line(no_model, capsys):
    (no_model / "r").mkdir()
    (no_model / "r" / "recipe.json").write_text("[1, 2]", encoding="utf-8")
    rc, err = run("reproduce arm-fig-mechanism --model tiny --out r", capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "recipe.json is not a recipe record (a JSON object)" in err


def test_a_problem_file_answer_with_a_lone_surrogate_is_refused_before_the_model(no_model, capsys):
    (no_model / "p.jsonl").write_text('{"problem": "What is 1+1?", "answer": "2\\udcff"}\n', encoding="utf-8")
    rc, err = run("eval --model tiny --data p.jsonl --max-new-tokens 2 --out e", capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "line 1: 'answer' holds a lone surrogate (U+DCFF" in err


def test_a_failing_write_of_the_tiny_tokenizer_is_one_line(monkeypatch, tmp_path, capsys):
    """What a file-size limit (``ulimit -f``) does while ``--model tiny`` is set up: the tokenizers library
    raises a bare ``Exception``."""
    import transformers

    def too_large(self, *args, **kwargs):
        raise Exception("File too large (os error 27)")  # noqa: TRY002 - what the tokenizers library raises

    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "save_pretrained", too_large)
    testing.tiny_tokenizer.cache_clear()
    try:
        rc, err = run(f"attention --model tiny --question 'What is 2+3?' --out {tmp_path / 'a'}", capsys)
    finally:
        testing.tiny_tokenizer.cache_clear()
    assert rc == 2 and err.strip().endswith("raise the file-size limit (ulimit -f)."), err
    assert "cannot write the tiny test model's tokenizer" in err and "File too large (os error 27)" in err


def test_nan_in_a_weight_is_named_as_nan_logits_before_generation(monkeypatch, tmp_path, capsys):
    model = tiny_model(seed=0)
    weight = dict(model.named_parameters())[
        "model.layers.1._original_component.self_attn._original_component.q_proj._original_component.weight"]
    with torch.no_grad():
        weight[0, 0] = float("nan")
    monkeypatch.setattr(common, "tiny_model", lambda seed=0: model)
    rc, err = run(f"eval --model tiny --problems arithmetic --limit 1 --conditions w/o --max-new-tokens 2 "
                  f"--no-progress --out {tmp_path / 'e'}", capsys)
    assert rc == 2 and err.count("\n") == 1, err
    # named at load (lensprobe.load_model), before even the 5-token probe that named it before
    assert "the weight model.layers.1.self_attn.q_proj.weight holds 1 NaN or infinite value(s)" in err
    assert "transformers<5.24" not in err


@pytest.mark.parametrize(("count", "message"), [
    (200, "math500: condition 'w/ long' fits no problem in the model's context of 256 tokens (each of its prompts "
          "alone exceeds it)"),
    (400, "define.'w/ long': count 400 x 1 token(s) per repetition exceeds the model's context of 256 tokens: "
          "lower count"),  # refused before its text is built
])
def test_a_condition_that_fits_no_problem_is_refused_before_the_first_forward(monkeypatch, tmp_path, capsys, count,
                                                                              message):
    recipe = tmp_path / "long.toml"
    recipe.write_text('title = "long filler"\nkind = "table"\nbenchmarks = ["math500"]\n'
                      f'conditions = ["w/o", "w/ long"]\n[define."w/ long"]\nbase = "w/ Mless"\ncount = {count}\n',
                      encoding="utf-8")
    from lensprobe.evals.running import harness
    monkeypatch.setattr(harness, "run_plan", lambda *a, **k: pytest.fail("generation started"))
    rc, err = run(f"reproduce {recipe} --model tiny --limit 2 --max-new-tokens 2 --no-progress "
                  f"--out {tmp_path / 'r'}", capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert message in err
    assert "share no answered problems" not in err
    assert not (tmp_path / "r" / "table.md").exists()
