"""``lensprobe reproduce`` and ``lp.reproduce``: shipped recipes, a table beside the published numbers
(accuracy checked by hand over the result rows), a user's own recipe file, and clear errors."""

import fnmatch
import json
import re
from pathlib import Path

import pandas as pd
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.reproduce_figures import FIGURES
from lensprobe.app.reproduce_samples import best_of_name
from lensprobe.app.sections.evals import build_math500_section
from lensprobe.evals.grading.grade import grade_paper_exact
from lensprobe.evals.results.published import published_numbers

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_recipe_loads_and_names_published_cells(capsys):
    recipes = lp.list_recipes()
    names = [r.name for r in recipes]
    assert {"arm-table1", "arm-table2", "arm-table3a", "arm-table5", "lt-fig-thinking-traces"} <= set(names)
    published = {(n.table, n.benchmark, n.condition) for n in published_numbers() if n.value is not None}
    for r in recipes:
        if r.kind == "figure":
            assert r.figure in FIGURES, r.name
            continue
        if r.table is None:  # the paper publishes these numbers as a figure only
            continue
        rows = [*r.conditions, *([best_of_name(c, 5) for c in r.conditions] if r.best_of else [])]
        for bench in r.benchmarks:  # every cell the recipe runs has a number to be compared with
            for cond in rows:
                assert (r.table, bench, cond) in published, (r.name, bench, cond)
    assert set(FIGURES) <= {r.figure for r in recipes if r.kind == "figure"}
    assert main(["reproduce", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(re.search(rf"^{re.escape(n)}\s", listed, re.M) for n in names)


def test_every_data_file_of_the_package_is_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in (ROOT / "lensprobe").rglob("*"):
        if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        rel = path.relative_to(ROOT / Path(*package.split(".")))
        owners = [(pkg, pats) for pkg, pats in globs.items() if package == pkg or package.startswith(pkg + ".")]
        ok = any(fnmatch.fnmatch(str(path.relative_to(ROOT / Path(*pkg.split(".")))), pat)
                 for pkg, pats in owners for pat in pats)
        assert ok, f"{rel} of {package} is not listed in pyproject.toml's package-data"


def test_table_recipe_on_the_tiny_model(tmp_path, tiny):
    out = tmp_path / "t1"
    res = lp.reproduce("arm-table1", tiny, out=out, limit=3, max_new_tokens=3, progress=False)
    table = res.table
    assert list(table["benchmark"]) == ["math500", "math500", "aime2024", "aime2024"]
    assert list(table["condition"]) == ["w/o", "w/ Mless"] * 2
    # the published columns are Table 1's numbers, model by model
    for n in published_numbers():
        if n.table == "1":
            row = table[(table["benchmark"] == n.benchmark) & (table["condition"] == n.condition)]
            assert row[f"{n.model} (Table 1)"].item() == n.value
    # this run's accuracy, by hand over the JSONL rows: the authors' verdict on prompt + generation
    rows = [json.loads(line) for line in (out / "runs" / "math500" / "results-rank0.jsonl").read_text().splitlines()]
    for cond in ("w/o", "w/ Mless"):
        mine = [r for r in rows if r["condition"] == cond and r["finish"] != "error"]
        by_hand = [grade_paper_exact(r["prompt"] + r["generation"], r["answer"]) for r in mine]
        got = table[(table["benchmark"] == "math500") & (table["condition"] == cond)]
        assert got["run: samples graded"].item() == len(mine)
        assert got["run: accuracy (authors' grader)"].item() == round(100 * sum(by_hand) / len(by_hand), 1)
        assert got["run: accuracy (math-verify)"].item() == round(
            100 * sum(bool(r["math-verify"]) for r in mine) / len(mine), 1)
    assert table[table["benchmark"] == "aime2024"]["run: samples graded"].isna().all()  # no AIME data given: published only
    assert any("aime2024: no problems" in n and "--benchmark-data aime2024=FILE" in n for n in res.notes)
    config = json.loads((out / "runs" / "math500" / "config.json").read_text())
    assert config["settings"]["generation"]["protocol"] == "arm-math500"
    assert config["settings"]["generation"]["max_new_tokens"] == 3
    md = (out / "table.md").read_text()
    assert "not one of the paper's models" in md and "| 63.9 |" in md
    csv = pd.read_csv(out / "table.csv")  # the table, then each cell's facts
    pd.testing.assert_frame_equal(csv[table.columns], table.astype({"run: samples graded": "float64", "run: runs": "float64"}),
                                  check_dtype=False)
    assert (out / "report" / "index.html").is_file()


def test_a_users_own_recipe_file(tmp_path, tiny):
    recipe = tmp_path / "mine.toml"
    recipe.write_text('title = "Mine"\nkind = "table"\ntable = "5"\nprotocol = "arm-math500"\n'
                      'benchmarks = ["MATH-500"]\nconditions = ["w/ Mless ?", "w/o"]\n'
                      '[define."w/ Mless ?"]\nbase = "w/ Mless"\nsymbol = "?"\ncount = 3\n')
    res = lp.reproduce(str(recipe), tiny, out=tmp_path / "o", limit=1, max_new_tokens=2, progress=False)
    # "w/ Mless ?" is Table 5's condition (55 "?"); 3 of them is another condition, renamed visibly, never shown
    # beside the paper's number, whose row stays on its own (published only)
    mine = "w/ Mless ? (own definition)"
    run = res.table[res.table["run: samples graded"].notna()]
    assert list(run["condition"]) == [mine, "w/o"]
    assert run["Qwen2.5-Math-7b (Table 5)"].isna().tolist() == [True, False]
    paper = res.table[res.table["condition"] == "w/ Mless ?"]
    assert paper["run: samples graded"].isna().all() and paper["Qwen2.5-Math-7b (Table 5)"].tolist() == [69.6, 22.2]
    rows = lp.evals.load_results(tmp_path / "o" / "runs" / "math500")
    prompt = rows[rows["condition"] == mine]["prompt"].item()
    assert prompt.startswith(lp.PAPER_SYSTEM_PROMPT + "? ? ?") and "? ? ? ?" not in prompt


def test_bad_recipes_and_arguments_fail_before_the_model_loads(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "table"\ntable = "1"\nbenchmarks = ["math500"]\nconditions = ["w/o"]\nmodel = "x"\n')
    missing_model = str(tmp_path / "no-such-model")
    cases = [
        (["reproduce", "arm-table9"], r"unknown recipe 'arm-table9': use one of \[.*arm-table1"),
        (["reproduce", str(bad)], r"unknown field\(s\) \['model'\]"),
        (["reproduce", "arm-table1", "--benchmark-data", "aime2025=x.jsonl"], r"x.jsonl does not exist"),
        (["reproduce", "arm-table1", "--benchmark-data", "gsm8k"], r"--benchmark-data takes BENCHMARK=FILE"),
        (["reproduce", "arm-table1", "--limit", "0"], r"argument --limit: expected a whole number >= 1, got 0"),
        (["reproduce", "arm-table1", "--runs", "0"], r"argument --runs: expected a whole number >= 1, got 0"),
        (["reproduce", "arm-table2", "--arm-c", "0.1"], r"give both --arm-c and --arm-percentile"),
        (["reproduce"], r"name a recipe"),
    ]
    for argv, message in cases:
        assert main([*argv, "--model", missing_model, "--out", str(tmp_path / "o")]) == 2, argv
        err = capsys.readouterr().err
        assert re.search(message, err) and err.count("\n") == 1, (argv, err)
    with pytest.raises(lp.LensprobeError, match=r"data for aime2025, which recipe 'arm-table1' does not run"):
        lp.reproduce("arm-table1", None, data={"AIME25": __file__})
    with pytest.raises(lp.LensprobeError, match=r"runs must be a positive integer, got 0"):
        lp.reproduce("arm-table1", None, runs=0)


def test_figure_recipe_writes_the_study(tmp_path, tiny):
    res = lp.reproduce("attn-fig-token-classes", tiny, out=tmp_path / "f", quick=True)
    assert res.table is None and (tmp_path / "f" / "report" / "index.html").is_file()
    assert "without numbers" in (tmp_path / "f" / "figure.md").read_text()
    csvs = list((tmp_path / "f" / "report").rglob("*.csv"))
    assert csvs and set(pd.read_csv(csvs[0]).columns) >= {"layer"}


def test_the_demo_report_links_every_recipe(tiny):
    intro = build_math500_section(tiny, quick=True).intro
    for r in lp.list_recipes():
        assert f"<code>lensprobe reproduce {r.name}</code>" in intro, r.name
    assert "docs/reproducing.md" in intro
