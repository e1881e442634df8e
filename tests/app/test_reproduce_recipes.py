"""The recipes of Table 3b (lm-eval, local task files), Table 7, Table 8 (sampling, Best-of-N), Figure 6 (pass@3), Figure 8 (filler length), Figure 10
(meaningful tokens) and the mechanism figure, on the tiny model: every number recomputed by hand from the rows."""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.reproduce_samples import best_of_rows, pass_numbers
from lensprobe.app.reproduce_tables import recipe_conditions
from lensprobe.core.models.testing import tiny_tokenizer
from lensprobe.evals.results.published import published_numbers
from lensprobe.evals.running.execute import ErrorRowsWarning

AIME = Path(__file__).resolve().parents[1] / "fixtures" / "aime" / "aime-mini.jsonl"
ARM = lp.ARM(c=0.13, percentile=99.5)
ACC = "run: accuracy (authors' grader)"


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("results-rank*.jsonl")) for line in f.read_text().splitlines()]


def _pct(values) -> float:
    values = list(values)
    return round(100 * sum(values) / len(values), 1)


def test_table7_base_models_beside_the_published_numbers(tmp_path, tiny):
    out = tmp_path / "t7"
    res = lp.reproduce("arm-table7", tiny, out=out, limit=2, max_new_tokens=3, arm=ARM, progress=False)
    table = res.table
    for n in (n for n in published_numbers() if n.table == "7"):
        row = table[(table["benchmark"] == n.benchmark) & (table["condition"] == n.condition)]
        assert row[f"{n.model} (Table 7)"].item() == n.value
    rows = _rows(out / "runs" / "math500")
    for cond in ("w/o", "ARM"):
        mine = [r for r in rows if r["condition"] == cond and r["finish"] != "error"]
        got = table[(table["benchmark"] == "math500") & (table["condition"] == cond)]
        assert got["run: samples graded"].item() == len(mine) == 2
        assert got[ACC].item() == _pct(r["paper-exact"] for r in mine)
    arm_cell = next(c for c in res.cells if c["condition"] == "ARM")
    assert arm_cell["columns"]["run: ARM"].startswith("layer=0, c=0.13, percentile=99.5")
    assert not arm_cell["comparable"] and any("not the authors' preset" in r for r in arm_cell["reasons"])
    # no ARM given: the base models have no preset (neither the paper nor the code gives one), the rows are skipped
    _, notes = recipe_conditions(lp.load_recipe("arm-table7"), tiny, "math500")
    assert notes and "ARM rows skipped" in notes[0]


def test_figure8_filler_lengths_and_the_curve(tmp_path, tiny):
    out = tmp_path / "f8"
    # the tiny model's context is 256 tokens: the second problem with 70 '/' does not fit, an error row
    with pytest.warns(ErrorRowsWarning, match="context is 256"):
        res = lp.reproduce("arm-fig8-filler-length", tiny, out=out, limit=2, max_new_tokens=3, progress=False)
    x70 = next(c for c in res.cells if c["condition"] == "w/ Mless x70")
    assert x70["errors"] == 1 and any("1 error row(s)" in r for r in x70["reasons"])
    assert not [c for c in res.table.columns if "(Table" in c]  # the paper publishes a figure only
    assert "publishes these numbers as a figure only" in (out / "table.md").read_text()
    rows = pd.DataFrame(_rows(out / "runs" / "math500"))
    lengths = {"w/o": 0, "w/ Mless x10": 10, "w/ Mless x25": 25, "w/ Mless x40": 40, "w/ Mless": 55,
               "w/ Mless x70": 70}
    assert list(res.table["condition"]) == list(lengths)
    for cond, length in lengths.items():
        prompt = rows[(rows["condition"] == cond) & rows["prompt"].notna()]["prompt"].iloc[0]
        run = " ".join(["/"] * length)
        assert prompt.startswith(lp.PAPER_SYSTEM_PROMPT + run) and not prompt.startswith(lp.PAPER_SYSTEM_PROMPT + run + " /")
    curve = pd.read_csv(next((out / "report").rglob("curve.csv")))
    assert curve["level"].tolist() == list(lengths.values())
    for cond, acc in zip(curve["condition"].index, curve["accuracy"], strict=True):
        name = list(lengths)[cond]
        graded = rows[(rows["condition"] == name) & rows["paper-exact"].notna()]
        assert acc == pytest.approx(graded["paper-exact"].astype(bool).mean())
        assert res.table[res.table["condition"] == name]["run: samples graded"].item() == len(graded)


def test_figure10_meaningful_control(tmp_path, tiny):
    out = tmp_path / "f10"
    res = lp.reproduce("arm-fig10-meaningful-tokens", tiny, out=out, limit=2, max_new_tokens=3, progress=False)
    rows = pd.DataFrame(_rows(out / "runs" / "math500"))
    mful = rows[rows["condition"] == "w/ Mful"]["prompt"].iloc[0]
    assert mful.startswith(lp.PAPER_SYSTEM_PROMPT + " ".join(["he"] * 55))
    assert "/ /" not in mful and " ".join(["/"] * 55) in rows[rows["condition"] == "w/ Mless"]["prompt"].iloc[0]
    for cond in ("w/o", "w/ Mless", "w/ Mful"):
        mine = rows[rows["condition"] == cond]
        assert res.table[res.table["condition"] == cond][ACC].item() == _pct(mine["paper-exact"])


def test_pass_numbers_by_hand():
    # problem a: 20 samples, 2 correct; b: 20 samples, 0 correct; c: 20 samples, 19 correct
    verdicts = {"a": [True] * 2 + [False] * 18, "b": [False] * 20, "c": [True] * 19 + [False]}
    rows = pd.DataFrame([{"condition": "w/o", "problem_id": p, "sample": i, "paper-exact": v}
                         for p, vs in verdicts.items() for i, v in enumerate(vs)])
    each = [1 - math.comb(18, 3) / math.comb(20, 3), 0.0, 1.0]
    mean = sum(each) / 3
    se = math.sqrt(sum((v - mean) ** 2 for v in each) / 2) / math.sqrt(3)
    got = pass_numbers(rows, "w/o", 3)
    assert got["run: pass@3 (authors' grader)"] == round(100 * mean, 1)
    assert got["run: pass@3 95% CI low"] == round(100 * max(0, mean - 1.96 * se), 1)
    assert got["run: pass@3 95% CI high"] == round(100 * min(1, mean + 1.96 * se), 1)


def test_figure6_pass3_on_the_tiny_model(tmp_path, tiny):
    out = tmp_path / "f6"
    res = lp.reproduce("arm-fig6-pass3", tiny, out=out, limit=2, max_new_tokens=3, arm=ARM, data={"aime2024": AIME},
                       progress=False)
    rows = pd.DataFrame(_rows(out / "runs" / "aime2024"))
    config = json.loads((out / "runs" / "aime2024" / "config.json").read_text())["settings"]["generation"]
    assert config["protocol"] == "arm-aime-pass3" and config["n_samples"] == 20 and config["top_k"] == 50
    for cond in ("w/o", "ARM"):
        mine = rows[rows["condition"] == cond]
        assert len(mine) == 40
        each = [1 - math.comb(20 - int(g.sum()), 3) / math.comb(20, 3) if 20 - g.sum() >= 3 else 1.0
                for _, g in mine.groupby("problem_id")["paper-exact"]]
        got = res.table[res.table["condition"] == cond]
        assert got["run: pass@3 (authors' grader)"].item() == round(100 * sum(each) / len(each), 1)
        assert got[ACC].item() == _pct(mine["paper-exact"])
        # the accuracy's interval is over problems (a problem's 20 samples are not independent)
        per = [g.mean() for _, g in mine.groupby("problem_id")["paper-exact"]]
        mean, se = sum(per) / 2, math.sqrt(sum((v - sum(per) / 2) ** 2 for v in per)) / math.sqrt(2)
        assert got["run: 95% CI low"].item() == round(100 * max(0, mean - 1.96 * se), 1)
        assert got["run: 95% CI high"].item() == round(100 * min(1, mean + 1.96 * se), 1)
    assert not [c for c in res.table.columns if "(Table" in c]
    text = lp.load_recipe("arm-fig6-pass3-text")
    assert text.protocol == "arm-aime-pass3-text" and text.conditions == ("w/o", "ARM")


def test_best_of_rows_take_the_majority_answer():
    rows = pd.DataFrame([
        # p1: "4" twice (the second and third samples) beats "5" once: the first "4" sample decides
        {"condition": "w/o", "problem_id": "p1", "sample": 0, "prediction": "5", "paper-exact": False},
        {"condition": "w/o", "problem_id": "p1", "sample": 1, "prediction": "4", "paper-exact": True},
        {"condition": "w/o", "problem_id": "p1", "sample": 2, "prediction": " 4", "paper-exact": True},
        # p2: a tie, 1 vs 2: the answer sampled first wins
        {"condition": "w/o", "problem_id": "p2", "sample": 1, "prediction": "2", "paper-exact": True},
        {"condition": "w/o", "problem_id": "p2", "sample": 0, "prediction": "1", "paper-exact": False},
        # p3: no answer twice beats one right answer
        {"condition": "w/o", "problem_id": "p3", "sample": 0, "prediction": None, "paper-exact": False},
        {"condition": "w/o", "problem_id": "p3", "sample": 1, "prediction": "7", "paper-exact": True},
        {"condition": "w/o", "problem_id": "p3", "sample": 2, "prediction": None, "paper-exact": False},
    ])
    best = best_of_rows(rows, "w/o", "Best-of-N (N=3)")
    assert best["problem_id"].tolist() == ["p1", "p2", "p3"]
    assert best["sample"].tolist() == [1, 0, 0] and best["paper-exact"].tolist() == [True, False, False]
    assert set(best["condition"]) == {"Best-of-N (N=3)"}


def test_table8_sampling_and_best_of_n(tmp_path, tiny):
    out = tmp_path / "t8"
    res = lp.reproduce("arm-table8", tiny, out=out, limit=2, max_new_tokens=3, arm=ARM, progress=False)
    gen = json.loads((out / "runs" / "math500" / "config.json").read_text())["settings"]["generation"]
    assert (gen["temperature"], gen["top_p"], gen["do_sample"], gen["n_samples"]) == (0.5, 0.95, True, 5)
    for cell in res.cells:
        assert cell["facts"]["sampling"]["temperature"] == 0.5 and cell["facts"]["sampling"]["top_p"] == 0.95
        assert "temperature=0.5, top_p=0.95" in cell["columns"]["run: sampling"]
    math = res.table[res.table["benchmark"] == "math500"]
    assert math["condition"].tolist() == ["w/o", "ARM", "Best-of-N (N=5)", "Best-of-N (N=5)+ARM"]
    assert math["Qwen2.5-Math-1.5B (Table 8)"].tolist() == [63.8, 67.8, 69.4, 71.2]
    rows = pd.DataFrame(_rows(out / "runs" / "math500"))
    for cond, best in (("w/o", "Best-of-N (N=5)"), ("ARM", "Best-of-N (N=5)+ARM")):
        mine = rows[rows["condition"] == cond]
        assert math[math["condition"] == cond]["run: samples graded"].item() == len(mine) == 10
        assert math[math["condition"] == cond][ACC].item() == _pct(mine["paper-exact"])
        by_hand = []
        for _, group in mine.sort_values("sample").groupby("problem_id", sort=False):
            answers = [str(p).strip() if p is not None and p == p else "" for p in group["prediction"]]
            top = max(answers.count(a) for a in answers)
            by_hand.append(group["paper-exact"].iloc[[answers.count(a) for a in answers].index(top)])
        assert math[math["condition"] == best]["run: samples graded"].item() == 2
        assert math[math["condition"] == best][ACC].item() == _pct(by_hand)


def test_mechanism_figure_recipe(tmp_path, tiny):
    res = lp.reproduce("arm-fig-mechanism", tiny, out=tmp_path / "m", quick=True)
    assert res.table is None and (tmp_path / "m" / "report" / "index.html").is_file()
    csvs = {p.stem for p in (tmp_path / "m" / "report").rglob("*.csv")}
    assert {"affine-fit", "activation-summary"} <= csvs
    assert lp.load_recipe("arm-fig-mechanism").notes in (tmp_path / "m" / "figure.md").read_text()


def test_new_recipe_fields_are_checked_before_the_model_loads(tmp_path, capsys):
    cases = {
        'curve = 3\n': r"curve is a table recipe's text field",
        'best_of = "oracle"\n': r"best_of must be one of \('majority',\)",
        'best_of = "majority"\n': r"best_of needs a protocol that draws several samples",
    }
    for line, message in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text('kind = "table"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\nconditions = ["w/o"]\n' + line)
        assert main(["reproduce", str(bad), "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "o")]) == 2
        assert re.search(message, capsys.readouterr().err), line


def test_the_list_is_aligned(capsys):
    assert main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(lp.list_recipes())
    for recipe, line in zip(lp.list_recipes(), lines, strict=True):  # the title starts at the same column everywhere
        assert line.startswith(recipe.name + " ") and line.endswith(recipe.title)
    assert len({len(line) - len(r.title) for r, line in zip(lp.list_recipes(), lines, strict=True)}) == 1
    assert len({line.index(" " + r.kind + " ") for r, line in zip(lp.list_recipes(), lines, strict=True)}) == 1


LMEVAL = Path(__file__).resolve().parents[1] / "fixtures" / "lmeval3b"


def _loglik(hf, tok, context: str, continuation: str) -> float:
    """log P(continuation | context) on the plain model, tokenized as lm-eval's hf model does."""
    ctx = tok(context, add_special_tokens=False).input_ids
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([whole[:-1]])).logits[0, len(ctx) - 1:].double(), -1)
    cont = torch.tensor(whole[len(ctx):])
    return float(logp[torch.arange(len(cont)), cont].sum())


def test_table3b_through_lm_eval_on_local_task_files(tmp_path, tiny, tiny_hf, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the tasks without data must say so, not reach the hub
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer().name_or_path)
    data = {"gsm8k": LMEVAL / "gsm8k.yaml", "arc_easy": LMEVAL / "arc_easy.yaml"}
    res = lp.reproduce("arm-table3b", tiny, out=tmp_path / "t3b", limit=3, data=data, arm=ARM, progress=False)
    table = res.table
    arc = [json.loads(line) for line in (LMEVAL / "arc_easy.jsonl").read_text().splitlines()][:3]
    right = []
    for row in arc:  # the highest-scoring choice is the label
        lls = [_loglik(tiny_hf, tok, f"Question: {row['question']}\nAnswer:", f" {c}") for c in row["choices"]]
        right.append(lls.index(max(lls)) == row["label"])
    got = table[(table["benchmark"] == "arc_easy") & (table["condition"] == "w/o")]
    assert got["run: documents scored"].item() == 3 and got["run: accuracy (lm-eval)"].item() == _pct(right)
    gsm = [json.loads(line) for line in (LMEVAL / "gsm8k.jsonl").read_text().splitlines()]
    matches = []
    for row in gsm:  # greedy, 3 tokens, cut at the first "until"
        ids = torch.tensor([tok(f"Question: {row['question']}\nAnswer:", add_special_tokens=False).input_ids])
        with torch.no_grad():
            out = tiny_hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0].split("Question:")[0]
        matches.append(text.strip() == row["answer"])
    got = table[(table["benchmark"] == "gsm8k") & (table["condition"] == "w/o")]
    assert got["run: accuracy (lm-eval)"].item() == _pct(matches)
    assert got["run: metric"].item() == "exact_match (none)"
    # the published numbers beside, every one of Table 3b
    for n in (n for n in published_numbers() if n.table == "3b"):
        row = table[(table["benchmark"] == n.benchmark) & (table["condition"] == n.condition)]
        assert row[f"{n.model} (Table 3b)"].item() == n.value
    # the sets without data: no number, a note naming where the data comes from and how to give it
    for task in ("arc_challenge", "mmlu", "boolq", "hellaswag", "openbookqa"):
        assert table[table["benchmark"] == task]["run: documents scored"].isna().all()
        note = next(n for n in res.notes if n.startswith(f"{task}: no data"))
        assert "Hugging Face dataset" in note and f"--benchmark-data {task}=task.yaml" in note
    arm_cell = next(c for c in res.cells if c["condition"] == "ARM")
    assert arm_cell["columns"]["run: ARM"].startswith("layer=0, c=0.13, percentile=99.5")
    assert all(not c["comparable"] and c["reasons"] for c in res.cells)
    assert "lm-eval" in (tmp_path / "t3b" / "table.md").read_text()


def test_table3b_data_is_checked_before_the_model_loads(tmp_path, capsys):
    wrong = tmp_path / "other.yaml"
    wrong.write_text("task: arc_challenge\n")
    cases = [(f"gsm8k={wrong}", r"defines task\(s\) \['arc_challenge'\], not gsm8k"),
             (f"gsm8k={LMEVAL / 'gsm8k.jsonl'}", r"is not an lm-eval task file"),
             (f"math500={LMEVAL / 'gsm8k.yaml'}", r"data for math500, which recipe 'arm-table3b' does not run"),
             (f"gsm8k={LMEVAL / 'gsm8k.yaml'} --runs 2 --max-new-tokens 8",
              r"runs lm-eval tasks, which set their own generation length and run once: drop runs and max_new_tokens")]
    for value, message in cases:
        argv = ["reproduce", "arm-table3b", "--benchmark-data", *value.split(" "), "--model", str(tmp_path / "no-model"),
                "--out", str(tmp_path / "o")]
        assert main(argv) == 2
        assert re.search(message, capsys.readouterr().err), value


def test_table3b_on_the_command_line_with_arm_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    argv = ["reproduce", "arm-table3b", "--model", "tiny", "--limit", "2", "--benchmark-data", f"arc_easy={LMEVAL / 'arc_easy.yaml'}",
            "--arm-c", "0.2", "--arm-percentile", "90", "--out", str(tmp_path / "o"), "--no-progress"]
    assert main(argv) == 0
    cells = json.loads((tmp_path / "o" / "table.json").read_text())["cells"]
    assert [(c["benchmark"], c["condition"]) for c in cells] == [("arc_easy", "w/o"), ("arc_easy", "ARM")]
    assert cells[1]["arm"]["settings"]["c"] == 0.2 and cells[1]["arm"]["settings"]["percentile"] == 90
    assert cells[1]["arm"]["source"] == "given (arm= / --arm-*)" and cells[0]["arm"] is None
    assert "gsm8k: no data" in capsys.readouterr().out
