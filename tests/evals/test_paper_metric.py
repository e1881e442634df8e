"""The authors' metric everywhere (paper-exact by default for their format, math-verify beside), the
named protocols recorded in config.json, benchmark inference, and --arm-* options over the presets."""

import json
import re
from types import SimpleNamespace

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.app.cli import build_parser, main
from lensprobe.app.commands.armargs import arm_from_args
from lensprobe.evals.grading.grade import grade_paper_exact
from lensprobe.evals.results.stats import accuracy, avg_at_k, compare, pass_at_k_table
from lensprobe.evals.results.verdicts import default_grader


def _problems(n=2):
    return lp.load_math500(limit=n)


def test_paper_format_folder_reports_paper_exact_with_math_verify_beside(tmp_path, tiny, capsys):
    out = tmp_path / "paper"
    assert main(["eval", "--model", "tiny", "--prompt-format", "paper", "--limit", "3", "--max-new-tokens", "3",
                 "--conditions", "w/o,w/ Mless", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "accuracy (paper-exact grader, 95% Wilson interval; math-verify beside)" in printed
    rows = lp.evals.load_results(out)
    assert rows.attrs["default_grader"] == "paper-exact"
    # accuracy by hand over the JSONL rows: the authors' verdict on prompt + generation
    raw = [json.loads(x) for x in (out / "results-rank0.jsonl").read_text().splitlines()]
    for cond in ("w/o", "w/ Mless"):
        verdicts = [grade_paper_exact(r["prompt"] + r["generation"], r["answer"]) for r in raw if r["condition"] == cond]
        got = accuracy(rows).set_index("condition").loc[cond]
        assert (got["grader"], got["correct"], got["n"]) == ("paper-exact", sum(verdicts), len(verdicts))
        assert re.search(rf"{re.escape(cond)}\s+{100 * sum(verdicts) / len(verdicts):5.1f}%.*math-verify", printed)
    assert compare(rows, "w/o", "w/ Mless").grader == "paper-exact"
    assert accuracy(rows, grader="math-verify")["grader"].unique().tolist() == ["math-verify"]
    assert main(["eval-report", str(out)]) == 0
    assert "paper-exact grader" in capsys.readouterr().out
    page = (out / "report" / "index.html").read_text()
    assert "accuracy (paper-exact)" in page and "<th>math-verify</th>" in page


def test_verdict_columns_are_any_boolean_column():
    df = pd.DataFrame({"condition": ["a", "a", "b", "b"], "problem_id": ["p", "q", "p", "q"], "sample": 0,
                       "math-verify": [True, False, False, False], "mine": [True, True, False, True]})
    assert accuracy(df, grader="mine").set_index("condition")["accuracy"].to_dict() == {"a": 1.0, "b": 0.5}
    assert compare(df, "a", "b", grader="mine").only_a == 1
    with pytest.raises(lp.LensprobeError, match=r"unknown grader: the result table has no 'exact' column"):
        accuracy(df, grader="exact")
    with pytest.raises(lp.LensprobeError, match=r"column 'problem_id' does not hold verdicts"):
        accuracy(df, grader="problem_id")
    assert default_grader({"settings": {"generation": {"protocol": "arm-math500", "prompt_format": "paper"}}}) == \
        "paper-exact"


def test_avg_at_k_is_the_mean_of_the_runs():
    verdicts = {"p": [1, 0, 1, 1, 0], "q": [0, 0, 1, 0, 0], "r": [1, 1, 1, 1, 1]}
    df = pd.DataFrame([{"condition": "w/o", "problem_id": pid, "sample": j, "paper-exact": bool(v)}
                       for pid, vs in verdicts.items() for j, v in enumerate(vs)])
    runs = [sum(vs[j] for vs in verdicts.values()) / 3 for j in range(5)]  # accuracy of run j, by hand
    got = avg_at_k(df, 5, grader="paper-exact").iloc[0]
    assert got["avg@5"] == pytest.approx(sum(runs) / 5) and (got["min"], got["max"]) == (min(runs), max(runs))
    assert avg_at_k(df, 2, grader="paper-exact").iloc[0]["avg@2"] == pytest.approx((runs[0] + runs[1]) / 2)
    assert pass_at_k_table(df, 3, grader="paper-exact").iloc[0]["avg"] == pytest.approx(sum(runs) / 5)
    with pytest.raises(lp.LensprobeError, match=r"avg@6 needs samples 0-5 of every problem"):
        avg_at_k(df, 6, grader="paper-exact")


def test_pass3_protocol_is_recorded_and_grades_the_generation_alone(tmp_path, tiny):
    rows = lp.evaluate(tiny, _problems(2), "w/o", out=tmp_path / "p3", protocol="arm-aime-pass3", n_samples=3,
                       max_new_tokens=3, progress=False)
    gen = json.loads((tmp_path / "p3" / "config.json").read_text())["settings"]["generation"]
    assert (gen["protocol"], gen["prompt_format"], gen["do_sample"], gen["n_samples"]) == \
        ("arm-aime-pass3", "paper", True, 3)
    assert rows["prompt"].str.startswith("Please reason step by step and put your final answer within \\boxed{}.").all()
    for r in rows.itertuples():  # the prompt's empty \boxed{} would match any answer: it is stripped first
        assert rows.loc[r.Index, "paper-exact"] == grade_paper_exact(r.generation, r.answer)
    assert lp.evals.accuracy(rows, k=3)["grader"].item() == "paper-exact"
    full = lp.EvalConfig.paper(tiny, protocol="arm-aime-pass3")
    assert (full.n_samples, full.max_new_tokens, full.do_sample) == (20, 512, True)
    with pytest.raises(lp.LensprobeError, match=r"protocol 'arm-math500' uses prompt_format='paper'"):
        lp.EvalConfig(protocol="arm-math500")
    with pytest.raises(lp.LensprobeError, match=r"unknown protocol 'arm'"):
        lp.evaluate(tiny, _problems(1), "w/o", protocol="arm", progress=False)


def test_benchmark_picks_the_preset():
    qwen = SimpleNamespace(cfg=SimpleNamespace(model_name="Qwen/Qwen2.5-Math-7B"))
    assert (lp.ARM.preset(qwen, "aime2024").c, lp.ARM.preset(qwen, "math500").c) == (0.05, 0.1)
    with pytest.raises(lp.LensprobeError, match=r"cannot tell which benchmark.*benchmark='math500'"):
        lp.ARM.preset(qwen, None)
    assert lp.evals.infer_benchmark(lp.load_math500(limit=3)) == "math500"
    assert lp.evals.infer_benchmark(lp.evals.arithmetic_problems(n=3)) is None


def test_arm_options_start_from_the_preset():
    def args(**kw):
        given = {"arm_source": "code", "model": "meta-llama/Llama-3.1-8B-Instruct", "benchmark": "math500", **kw}
        argv = ["eval"] + [s for k, v in given.items() if v is not None for s in ("--" + k.replace("_", "-"), str(v))]
        return build_parser().parse_args(argv)  # the namespace lensprobe eval reads

    code, paper = arm_from_args(args()), arm_from_args(args(arm_source="paper"))  # nothing else given: the preset
    assert (code.c, code.percentile, code.p_min, code.source) == (0.32, 90, 0.2, "code")
    assert (paper.c, paper.percentile, paper.p_min, paper.source) == (0.32, 90, 0.02, "paper")
    llama = arm_from_args(args(arm_percentile=95.0))
    assert (llama.c, llama.percentile, llama.p_min) == (0.32, 95.0, 0.2)
    gemma = arm_from_args(args(model="google/gemma-3-27b-it", benchmark="aime2024", arm_c=0.3))
    assert (gemma.c, gemma.percentile, gemma.variant) == (0.3, 0.965, "gemma")
    paper = arm_from_args(args(model="google/gemma-3-27b-it", benchmark="aime2024", arm_c=0.3, arm_source="paper"))
    assert paper.percentile == 0.85
    assert arm_from_args(args(model="x/tiny", arm_c=0.1, arm_percentile=90.0, arm_p_min=0.1)).p_min == 0.1
    with pytest.raises(lp.LensprobeError, match=r"^no ARM preset for 'tiny' to start from: give both --arm-c and "
                                                r"--arm-percentile\.$"):
        arm_from_args(args(model="x/tiny", arm_c=0.1))
    with pytest.raises(lp.LensprobeError, match=r"no benchmark to take llama-3.1-8b-instruct's ARM preset from .*: give both"):
        arm_from_args(args(arm_c=0.1, benchmark=None))
    with pytest.raises(lp.LensprobeError, match=r"no ARM gain for qwen2.5-7b-instruct on aime2024.*give both"):
        arm_from_args(args(model="Qwen/Qwen2.5-7B-Instruct", benchmark="aime2024", arm_c=0.1))


def test_cli_summary_shows_pass_at_k_and_avg_under_the_pass3_protocol(tmp_path, capsys):
    out = tmp_path / "p3"
    assert main(["eval", "--model", "tiny", "--protocol", "arm-aime-pass3", "--n-samples", "3", "--limit", "2",
                 "--max-new-tokens", "2", "--conditions", "w/o", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = lp.evals.load_results(out)
    table = pass_at_k_table(rows, 3, grader="paper-exact").iloc[0]
    assert re.search(rf"w/o\s+pass@3\s+{100 * table['pass@3']:5.1f}%\s+avg\s+{100 * table['avg']:5.1f}%", printed)
    assert "(2 problems, 6 samples)" in printed
    assert json.loads((out / "config.json").read_text())["settings"]["generation"]["protocol"] == "arm-aime-pass3"
