"""Prompt formats, the paper-exact column and ARM conditions in the evaluation harness (tiny model)."""

import json
from types import SimpleNamespace

import pytest
from oracles import authors_tokenizer

import lensprobe as lp
from lensprobe.core.prompts.conditions import paper_conditions
from lensprobe.core.prompts.prompt import PAPER_SYSTEM_PROMPT
from lensprobe.core.storage.identity import identity
from lensprobe.core.storage.rowfiles import row_line
from lensprobe.evals import Problem, load_results
from lensprobe.evals.grading.grade import grade_paper_exact
from lensprobe.evals.results.folder import read_rows, results_file
from lensprobe.evals.running.config import EvalConfig, paper_generation_settings
from lensprobe.evals.running.execute import ROW_COLUMNS
from lensprobe.interventions.arm import ARM

MLESS = " ".join(["/"] * 55)
QUESTIONS = ["What is 1+1?", "Compute 12 * 3.", "What is 7?", "Solve 2x + 3 = 7.", "What is 10 - 4?"]
VOLATILE = ["seconds", "rank", "config_hash"]  # the run's hash holds its batch size
TINY_ARM = ARM(c=0.5, percentile=95)


def problems(n=None):
    return [Problem(id=f"q{i}", problem=q, answer=str(i), level=1, subject="S")
            for i, q in enumerate(QUESTIONS[:n] if n else QUESTIONS)]


def stable(df):
    return df.drop(columns=VOLATILE).reset_index(drop=True)


# --------------------------------------------------------------------------- prompt formats


def test_paper_format_rows_hold_the_authors_string(tiny, tmp_path):
    probs = problems(3)
    df = lp.evaluate(tiny, probs, "w/o,w/ Mless", out=tmp_path, prompt_format="paper", max_new_tokens=6,
                     progress=False)
    expected = {"w/o": [PAPER_SYSTEM_PROMPT + p.problem for p in probs],
                "w/ Mless": [PAPER_SYSTEM_PROMPT + MLESS + p.problem for p in probs]}
    for cname, texts in expected.items():
        rows = df[df["condition"] == cname]
        assert list(rows["prompt"]) == texts
        # one call of the model's own tokenizer (AutoTokenizer.from_pretrained), not the bridge's, which adds a BOS
        own = authors_tokenizer(tiny.tokenizer.name_or_path)
        assert list(rows["prompt_tokens"]) == [len(own(t).input_ids) for t in texts]
        assert list(rows["prompt_tokens"]) == [len(tiny.tokenizer(t).input_ids) - 1 for t in texts]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["settings"]["generation"]["prompt_format"] == "paper"
    assert cfg["parts"]["w/ Mless"]["prompt_template"] == PAPER_SYSTEM_PROMPT + MLESS + "{question}"
    # the chat format of the same run is another configuration
    with pytest.raises(lp.LensprobeError, match="prompt_format: folder has 'paper', this run has 'chat'"):
        lp.evaluate(tiny, probs, "w/o", out=tmp_path, max_new_tokens=6, progress=False)


@pytest.mark.unchecked
def test_the_chat_format_is_recorded_in_the_identity_as_every_default(tiny, tmp_path):
    lp.evaluate(tiny, problems(1), "w/o", out=tmp_path, max_new_tokens=4, progress=False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["settings"]["generation"]["prompt_format"] == "chat"
    assert identity(EvalConfig(max_new_tokens=4)) == identity(EvalConfig(max_new_tokens=4, prompt_format="chat"))
    assert identity(EvalConfig(max_new_tokens=4, prompt_format="paper"))["prompt_format"] == "paper"
    with pytest.raises(lp.LensprobeError, match=r"prompt_format: expected one of chat, paper, got 'raw'"):
        EvalConfig(prompt_format="raw")


def test_paper_format_generates_2048_tokens_unless_told(tiny):
    assert EvalConfig.paper(tiny).max_new_tokens == 2048
    assert EvalConfig.paper(tiny, max_new_tokens=9).max_new_tokens == 9
    # the tiny model's context is 256: the default does not fit, and the error says what to do
    with pytest.raises(lp.LensprobeError, match=r"max_new_tokens=2048 leaves no room for a prompt in the model's "
                                                r"context of 256 tokens: lower max_new_tokens"):
        lp.evaluate(tiny, problems(1), "w/o", prompt_format="paper", progress=False)


def fake_model(**gen):
    return SimpleNamespace(original_model=SimpleNamespace(generation_config=SimpleNamespace(**gen)))


def test_paper_generation_settings_follow_the_models_generation_config(tiny):
    assert paper_generation_settings(tiny) == {"max_new_tokens": 2048, "do_sample": False}
    # an unset top_k is transformers 4.x's default, 50 (the authors' version)
    sampled = fake_model(do_sample=True, temperature=0.7, top_p=0.8, top_k=None, repetition_penalty=1.0)
    assert paper_generation_settings(sampled) == {"max_new_tokens": 2048, "do_sample": True, "temperature": 0.7,
                                                  "top_p": 0.8, "top_k": 50}
    greedy = fake_model(do_sample=False, temperature=0.7, top_p=0.8)
    assert paper_generation_settings(greedy) == {"max_new_tokens": 2048, "do_sample": False}
    assert paper_generation_settings(SimpleNamespace()) == {"max_new_tokens": 2048, "do_sample": False}
    qwen = fake_model(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)  # Qwen2.5 Instruct
    assert paper_generation_settings(qwen) == {"max_new_tokens": 2048, "do_sample": True, "temperature": 0.7,
                                               "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert paper_generation_settings(fake_model(do_sample=False, repetition_penalty=1.05)) == {
        "max_new_tokens": 2048, "do_sample": False, "repetition_penalty": 1.05}
    assert paper_generation_settings(fake_model(do_sample=True, top_k=0, min_p=0.05)) == {
        "max_new_tokens": 2048, "do_sample": True, "top_k": 0, "min_p": 0.05}
    assert identity(EvalConfig.paper(qwen, max_new_tokens=8))["repetition_penalty"] == 1.05
    # settings given win over the model's
    cfg = EvalConfig.paper(sampled, temperature=0.5, batch_size=2)
    assert (cfg.do_sample, cfg.temperature, cfg.top_p, cfg.batch_size) == (True, 0.5, 0.8, 2)


# --------------------------------------------------------------------------- the paper-exact column


def test_rows_carry_the_authors_verdict(tiny):
    df = lp.evaluate(tiny, problems(3), "w/o,w/ Mless", prompt_format="paper", max_new_tokens=5, progress=False)
    assert "paper-exact" in ROW_COLUMNS and "paper-exact" in df.columns
    for _, row in df.iterrows():
        assert row["paper-exact"] == grade_paper_exact(row["prompt"] + row["generation"], row["answer"])


def test_paper_exact_grades_prompt_plus_generation(tiny):
    from lensprobe.evals.running.execute import Item, RunInfo, make_row

    p = Problem(id="x", problem="What is 3+4?", answer="7")
    cond = paper_conditions(prompt_format="paper")["w/o"]
    prompt = cond.prompt_builder(tiny)(p.problem)
    info = RunInfo("m", "h", {"w/o": "c"}, 0)
    row = make_row(Item(p, 0, prompt), cond, [1, 2], r"so $\boxed{7}$.", "eos", 0.1, info)
    assert row["paper-exact"] is True and row["math-verify"] is True
    # no box in the generation: the authors' grader reads the prompt's own box ("{}"), not "7"
    row = make_row(Item(p, 0, prompt), cond, [1], "It is 7.", "eos", 0.1, info)
    assert row["paper-exact"] is False and row["prediction"] is None
    # their lenient rule: a prediction that is a substring of the reference counts
    q = Problem(id="y", problem="What is 5+5?", answer="10")
    row = make_row(Item(q, 0, prompt), cond, [1], r"\boxed{1}", "eos", 0.1, info)
    assert row["paper-exact"] is True and row["paper"] is False


def test_rows_without_the_paper_exact_column_still_read_and_resume(tiny, tmp_path):
    lp.evaluate(tiny, problems(2), "w/o", out=tmp_path, max_new_tokens=4, progress=False)
    path = results_file(tmp_path, 0)
    old = [{k: v for k, v in r.items() if k != "paper-exact"} for r in read_rows(tmp_path)]
    path.write_text("".join(row_line(r) for r in old), encoding="utf-8")  # rows of 0.4, each with its digest
    df = lp.evaluate(tiny, problems(4), "w/o", out=tmp_path, max_new_tokens=4, progress=False)
    assert len(df) == 4
    assert list(df["paper-exact"].iloc[:2]) == [None, None]
    assert all(isinstance(v, bool) for v in df["paper-exact"].iloc[2:])
    assert "paper-exact" in load_results(tmp_path).columns
    only_old = lp.evaluate(tiny, problems(2), "w/o", out=tmp_path, max_new_tokens=4, progress=False)
    assert list(only_old["paper-exact"]) == [None, None]


# --------------------------------------------------------------------------- ARM conditions


def test_arm_names_attach_the_given_arm(tiny, tmp_path):
    df = lp.evaluate(tiny, problems(3), "w/o,ARM,w/ Mless+ARM", out=tmp_path, arm=TINY_ARM, max_new_tokens=6,
                     progress=False)
    assert list(dict.fromkeys(df["condition"])) == ["w/o", "ARM", "w/ Mless+ARM"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    for name in ("ARM", "w/ Mless+ARM"):
        (desc,) = cfg["parts"][name]["interventions"]
        assert desc == {**identity(ARM(c=0.5, percentile=95, seed=0)), "seed": 0}  # the run's seed
    assert cfg["parts"]["ARM"]["prompt_template"] == cfg["parts"]["w/o"]["prompt_template"]
    assert cfg["parts"]["w/o"]["interventions"] == []


def test_arm_rows_are_deterministic_under_a_seed(tiny):
    run = dict(arm=TINY_ARM, max_new_tokens=8, progress=False, stop_at_eos=False)
    a = lp.evaluate(tiny, problems(), "ARM,w/ Mless+ARM", batch_size=1, **run)
    b = lp.evaluate(tiny, problems(), "ARM,w/ Mless+ARM", batch_size=4, **run)
    assert stable(a).equals(stable(b))  # ARM conditions run one problem at a time
    c = lp.evaluate(tiny, problems(), "ARM", seed=1, **run)
    assert (c["condition_hash"].iloc[0] != a["condition_hash"].iloc[0])
    # the ARM really changes the computation: its rows differ from the same model without it
    plain = lp.evaluate(tiny, problems(), "w/o", **run)
    strong = lp.evaluate(tiny, problems(), "ARM", arm=ARM(c=5.0, percentile=99, p_min=0.25),
                         max_new_tokens=8, progress=False, stop_at_eos=False)
    assert list(plain["generation"]) != list(strong["generation"])


def test_arm_with_sampling_is_deterministic(tiny):
    run = dict(arm=TINY_ARM, max_new_tokens=6, progress=False, do_sample=True, n_samples=2, seed=3)
    a = lp.evaluate(tiny, problems(3), "ARM", batch_size=1, **run)
    b = lp.evaluate(tiny, problems(3), "ARM", batch_size=6, **run)
    assert len(a) == 6 and stable(a).equals(stable(b))


def test_arm_condition_built_by_hand(tiny):
    mine = lp.Condition("ARM", interventions=(TINY_ARM,))
    by_name = lp.evaluate(tiny, problems(2), "ARM", arm=TINY_ARM, max_new_tokens=5, progress=False)
    by_hand = lp.evaluate(tiny, problems(2), [mine], max_new_tokens=5, progress=False)
    assert stable(by_name).equals(stable(by_hand))


def test_arm_without_a_preset_says_how_to_choose_c_and_percentile(tiny):
    with pytest.raises(lp.LensprobeError, match=r"no ARM preset for model .*choose c and percentile yourself.*"
                                                r"arm=lp\.ARM\(c=0\.1, percentile=95\).*interventions=\(lp\.ARM"):
        lp.evaluate(tiny, problems(1), "w/o,ARM", max_new_tokens=4, progress=False)
    # no ARM name: no preset needed
    assert len(lp.evaluate(tiny, problems(1), "w/o", max_new_tokens=2, progress=False)) == 1


def test_cli_prompt_format_and_arm_options(tmp_path, capsys):
    from lensprobe.app.cli import main

    data = tmp_path / "probs.jsonl"
    data.write_text("".join(json.dumps({"problem": p.problem, "answer": p.answer, "unique_id": p.id}) + "\n"
                            for p in problems(2)), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["eval", "--model", "tiny", "--data", str(data), "--conditions", "w/ Mless,ARM",
                 "--prompt-format", "paper", "--arm-c", "0.5", "--arm-percentile", "95",
                 "--max-new-tokens", "4", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["settings"]["generation"]["prompt_format"] == "paper" and cfg["settings"]["generation"]["max_new_tokens"] == 4
    assert cfg["parts"]["w/ Mless"]["prompt_template"] == PAPER_SYSTEM_PROMPT + MLESS + "{question}"
    assert cfg["parts"]["ARM"]["interventions"][0] == identity(ARM(c=0.5, percentile=95, seed=0))  # every field
    assert "paper-exact" in load_results(out).columns
    assert main(["eval", "--model", "tiny", "--data", str(data), "--conditions", "ARM", "--arm-c", "0.5",
                 "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "give both --arm-c and --arm-percentile" in capsys.readouterr().err
