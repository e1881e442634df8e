"""``lp.reproduce`` writes beside every number what it was computed under and whether it is comparable with
the paper's: the facts (read back here from the run's own folder), the verdict and its reasons, seeded runs,
graders that read only the generated text, output folders that never collide, checked recipes."""

import json
import statistics

import pandas as pd
import pytest
import transformers

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.provenance import PAPER_DTYPE, run_facts, verdict
from lensprobe.app.reproduce_tables import RUN_COLUMNS, beside_published, markdown_table
from lensprobe.core.models.testing import tiny_model
from lensprobe.evals.grading.grade import grade_paper_exact
from lensprobe.evals.results.published import paper_models

QWEN7 = "Qwen/Qwen2.5-Math-7B"


def _rows(folder):
    return [json.loads(line) for line in (folder / "results-rank0.jsonl").read_text().splitlines()]


def test_a_tiny_model_under_a_paper_models_name_is_not_comparable(tmp_path, tiny):
    out = tmp_path / "t1"
    res = lp.reproduce("arm-table1", tiny, out=out, limit=2, max_new_tokens=3, model_name=QWEN7, progress=False)
    published = paper_models()["qwen2.5-math-7b"]
    ours = {"n_layers": tiny.cfg.n_layers, "n_heads": tiny.cfg.n_heads, "n_kv_heads": tiny.cfg.n_key_value_heads,
            "d_model": tiny.cfg.d_model, "d_vocab": tiny.cfg.d_vocab}
    assert len(res.cells) == 2 and not any(c["comparable"] for c in res.cells)
    for cell in res.cells:
        why = "; ".join(cell["reasons"])
        for key, label in (("n_layers", "layers"), ("n_heads", "heads"), ("n_kv_heads", "KV heads"),
                           ("d_model", "width"), ("d_vocab", "vocabulary")):
            assert f"{label} {ours[key]} (published {published[key]})" in why
        assert "max_new_tokens 3" in why and "2 problems run of the benchmark's 500" in why
    md = (out / "table.md").read_text()
    assert "One of the paper's models" not in md and "0M-parameter" not in md
    params = sum(p.numel() for p in tiny.parameters())
    assert params < 1e6 and f"({params / 1e6:.2g}M parameters)" in md
    assert md.count("not comparable") >= 4  # the two cells in the table and in the comparability list
    # the run's columns say they are this run's; none is named like the paper's
    assert set(RUN_COLUMNS) <= set(res.table.columns) and "paper-exact" not in res.table.columns
    assert all(c.startswith("run: ") or c.endswith("(Table 1)") for c in res.table.columns[2:])


def test_every_cell_carries_the_facts_its_folder_records(tmp_path, tiny):
    out = tmp_path / "t1"
    lp.reproduce("arm-table1", tiny, out=out, limit=2, max_new_tokens=3, progress=False)
    config = json.loads((out / "runs" / "math500" / "config.json").read_text())
    csv = pd.read_csv(out / "table.csv", dtype={"run: seeds": str})
    run = csv[csv["run: samples graded"].notna()]
    assert len(run) == 2
    for _, row in run.iterrows():
        assert row["run: weights digest"] == config["settings"]["model"]["weights"]
        assert row["run: dtype"] == str(next(tiny.parameters()).dtype).removeprefix("torch.") == "float32"
        assert row["run: device"] == "cpu"
        assert row["run: model configuration"] == (
            f"{tiny.cfg.n_layers} layers, {tiny.cfg.n_heads} heads, {tiny.cfg.n_key_value_heads} KV heads, "
            f"width {tiny.cfg.d_model}, vocabulary {tiny.cfg.d_vocab}")
        assert row["run: problems"] == "2 of 500" and row["run: seeds"] == "0"
        assert row["run: max new tokens"] == config["settings"]["generation"]["max_new_tokens"] == 3
        assert row["run: prompt format"] == "paper (protocol arm-math500)"
        assert row["run: sampling"] == "do_sample=False"  # the tiny model's generation config: greedy
        assert row["run: error rows"] == 0
        assert row["run: lensprobe"] == lp.__version__ and row["run: transformers"] == transformers.__version__
        assert row["run: comparable"] == "not comparable" and "is not one of the paper's models" in row[
            "run: why not comparable"]
    cells = json.loads((out / "table.json").read_text())["cells"]
    assert [(c["benchmark"], c["condition"]) for c in cells] == [("math500", "w/o"), ("math500", "w/ Mless")]
    for c in cells:
        assert c["facts"]["model"]["weights"] == config["settings"]["model"]["weights"]
        assert c["published"]["Qwen2.5-Math-1.5B (Table 1)"] in (63.9, 65.9) and c["reasons"]
    report = (out / "report" / "index.html").read_text()
    assert "Comparability" in report and "not comparable" in report


def test_versions_device_and_dtype_come_from_the_rows_not_the_machine_that_writes_the_table(tmp_path, tiny):
    from importlib.metadata import version

    import torch

    tl_version = version("transformer_lens")
    out = tmp_path / "t1"
    lp.reproduce("arm-table1", tiny, out=out, limit=2, max_new_tokens=3, progress=False)
    folder = out / "runs" / "math500"
    rows = _rows(folder)
    made = (f"lensprobe {lp.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"transformer_lens {tl_version}")
    assert {(r["versions"], r["device"], r["dtype"]) for r in rows} == {(made, "cpu", "float32")}
    config = json.loads((folder / "config.json").read_text())
    frame = pd.DataFrame(rows)
    facts = run_facts(tiny, config, name="tiny", rows=frame)
    assert facts["versions"] == {"lensprobe": lp.__version__, "torch": torch.__version__,
                                 "transformers": transformers.__version__,
                                 "transformer_lens": tl_version}
    # rows made elsewhere: the table says what the rows say, not what this process runs
    older = frame.assign(versions=made.replace(f"torch {torch.__version__}", "torch 2.1.0"), device="cuda:0",
                         dtype="bfloat16")
    facts = run_facts(tiny, config, name="tiny", rows=older)
    assert (facts["versions"]["torch"], facts["device"], facts["dtype"]) == ("2.1.0", "cuda:0", "bfloat16")
    # a run resumed under another torch: both, and a dtype that is not one value is not the authors' fp32
    mixed = pd.concat([frame.iloc[:1], older.iloc[1:]])
    facts = run_facts(tiny, config, name="tiny", rows=mixed)
    assert facts["versions"]["torch"] == f"{torch.__version__} | 2.1.0" and facts["dtype"] == "float32 | bfloat16"
    assert any("dtype float32 | bfloat16" in r for r in verdict(facts, {"problems": 2, "of": 500, "runs": 1,
                                                                        "errors": 0, "arm": None}, tiny)[1])
    # rows written before these were recorded
    facts = run_facts(tiny, config, name="tiny", rows=frame.drop(columns=["versions", "device", "dtype"]))
    assert facts["versions"]["torch"] == facts["device"] == facts["dtype"] == "not recorded"
    csv = pd.read_csv(out / "table.csv")
    run = csv[csv["run: samples graded"].notna()].iloc[0]
    assert (run["run: torch"], run["run: TransformerLens"]) == (torch.__version__, tl_version)


def test_the_verdict_names_each_difference_from_the_protocol(tiny):
    config = {"settings": {"model": {"weights": "x", "dtype": "torch.float32", **{
        k: v for k, v in paper_models()["qwen2.5-math-7b"].items() if k.startswith(("n_", "d_")) and k != "n_kv_heads"}},
        "generation": {"protocol": "arm-math500", "prompt_format": "paper", "max_new_tokens": 2048}}, "hash": "h"}
    facts = run_facts(tiny, config, name=QWEN7)
    facts["model"]["n_kv_heads"] = paper_models()["qwen2.5-math-7b"]["n_kv_heads"]
    whole = {"problems": 500, "of": 500, "runs": 1, "errors": 0, "arm": None}
    assert verdict(facts, whole, tiny) == (True, [])
    one_off = [  # each departure from the protocol gives exactly one reason
        ({**facts, "dtype": "bfloat16"}, whole, {}, f"dtype bfloat16; the authors ran {PAPER_DTYPE}"),
        ({**facts, "max_new_tokens": 512}, whole, {}, "max_new_tokens 512; the authors' is 2048"),
        (facts, {**whole, "problems": 50}, {}, "50 problems run of the benchmark's 500"),
        (facts, {**whole, "errors": 3}, {}, "3 error row(s) without a verdict, so 3 sample(s) fewer are graded"),
        (facts, whole, {"paper_runs": 5, "random": True}, "1 run(s) of a cell that varies with the seed"),
        ({**facts, "model": {**facts["model"], "d_vocab": 1}}, whole, {}, "vocabulary 1 (published 152064)"),
        ({**facts, "model": {**facts["model"], "name": "my-org/other"}}, whole, {}, "not one of the paper's models"),
        ({**facts, "sampling": {**facts["sampling"], "do_sample": True}}, whole, {}, "sampling do_sample=True"),
        (facts, {**whole, "arm": {"settings": {"c": 0.2}, "preset": {"c": 0.1}}}, {}, "ARM settings c=0.2"),
    ]
    for f, cell, kw, reason in one_off:
        comparable, reasons = verdict(f, cell, tiny, **kw)
        assert not comparable and len(reasons) == 1 and reason in reasons[0], (reason, reasons)
    assert verdict(facts, whole, tiny, paper_runs=5, random=False)[0]  # greedy: one run stands for five
    table9 = ("Qwen/Qwen2.5-Math-1.5B", "meta-llama/Llama-3.1-8B-Instruct")  # a table without this model
    comparable, reasons = verdict(facts, whole, tiny, table_models=table9)
    assert not comparable and reasons == [f"the table has no number for {QWEN7} (it has {', '.join(table9)})"]
    assert verdict(facts, whole, tiny, table_models=(QWEN7,))[0]


def test_seeded_runs_of_a_sampling_model_report_their_mean_and_spread(tmp_path):
    model = tiny_model(seed=0)
    model.original_model.generation_config.do_sample = True  # its loaded generation config samples
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "sampled"\ntable = "1"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\n'
                      'conditions = ["w/o"]\nruns = 5\n')
    out = tmp_path / "o"
    res = lp.reproduce(str(recipe), model, out=out, limit=3, max_new_tokens=4, runs=3, progress=False)
    folders = [out / "runs" / "math500", out / "runs" / "math500.seed1", out / "runs" / "math500.seed2"]
    by_hand = []
    for seed, folder in enumerate(folders):
        config = json.loads((folder / "config.json").read_text())
        assert config["settings"]["generation"].get("seed", 0) == seed
        assert config["settings"]["generation"]["do_sample"] is True
        rows = _rows(folder)
        by_hand.append(100 * sum(r["paper-exact"] for r in rows) / len(rows))
    row = res.table[res.table["run: samples graded"].notna()].iloc[0]
    assert row["run: runs"] == 3 and row["run: samples graded"] == 3
    assert row["run: accuracy (authors' grader)"] == round(statistics.fmean(by_hand), 1)
    assert row["run: sd over runs"] == round(statistics.stdev(by_hand), 1)
    assert pd.isna(row["run: 95% CI low"])  # an interval of one run would misstate the mean of three
    cell = res.cells[0]
    assert cell["seeds"] == [0, 1, 2] and cell["varies with the seed"]
    assert any("3 run(s) of a cell that varies with the seed; Table 1 averages 5" in r for r in cell["reasons"])
    assert not (out / "runs" / "math500.seed3").exists()


def test_a_greedy_model_runs_once_and_says_why_and_arm_runs_every_seed(tmp_path, tiny):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "greedy"\ntable = "3a"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\n'
                      'conditions = ["w/o", "ARM"]\nruns = 3\n')
    arm = lp.ARM(c=0.05, percentile=90)
    res = lp.reproduce(str(recipe), tiny, out=tmp_path / "o", limit=2, max_new_tokens=3, arm=arm, progress=False)
    ran = res.table[res.table["run: samples graded"].notna()]
    runs = dict(zip(ran["condition"], ran["run: runs"], strict=True))
    assert runs["w/o"] == 1 and runs["ARM"] == 3  # ARM draws random numbers: its rows depend on the seed
    assert any("math500: w/o: greedy: one run; --runs 3 would repeat it (protocol 'arm-math500' decodes greedily"
               in n for n in res.notes)
    assert not any("generation config samples" in n for n in res.notes)  # the tiny model's config is greedy
    assert not any("greedy decoding" in n and "identical" in n for n in res.notes)
    arm_cell = next(c for c in res.cells if c["condition"] == "ARM")
    assert arm_cell["columns"]["run: ARM"].startswith("layer=0, c=0.05, percentile=90")
    assert arm_cell["columns"]["run: ARM source"] == "given (arm= / --arm-*)"
    assert "under greedy decoding" not in lp.load_recipe("arm-table1").notes  # no blanket claim about the models


def test_a_sampling_model_under_a_greedy_format_runs_once_and_is_labelled(tmp_path):
    """The model's generation config samples, the chat format decodes greedily: --runs 3 is one run (three
    would repeat it, spread 0), said in the notes (printed by the command) and the table; a protocol that follows
    the model's sampling runs all three."""
    model = tiny_model(seed=0)
    model.original_model.generation_config.do_sample = True
    recipe = tmp_path / "chat.toml"
    recipe.write_text('name = "chat-runs"\ntable = "1"\nbenchmarks = ["math500"]\nconditions = ["w/o"]\nruns = 5\n')
    res = lp.reproduce(str(recipe), model, out=tmp_path / "o", limit=2, max_new_tokens=3, runs=3, progress=False)
    row = res.table[res.table["run: samples graded"].notna()].iloc[0]
    assert row["run: runs"] == 1 and res.cells[0]["seeds"] == [0] and not res.cells[0]["varies with the seed"]
    assert not (tmp_path / "o" / "runs" / "math500.seed1").exists()
    config = json.loads((tmp_path / "o" / "runs" / "math500" / "config.json").read_text())
    assert config["settings"]["generation"].get("do_sample", False) is False  # what ran: greedy
    greedy = "math500: w/o: greedy: one run; --runs 3 would repeat it (the chat format decodes greedily"
    labelled = "the model's generation config samples (do_sample=true), but the chat format decodes greedily"
    assert any(greedy in n for n in res.notes) and any(labelled in n for n in res.notes)
    md = (tmp_path / "o" / "table.md").read_text()
    assert greedy in md and labelled in md
    sampled = tmp_path / "sampled.toml"
    sampled.write_text('name = "sampled-runs"\ntable = "1"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\n'
                       'conditions = ["w/o"]\nruns = 5\n')
    res = lp.reproduce(str(sampled), model, out=tmp_path / "s", limit=2, max_new_tokens=3, runs=3, progress=False)
    assert res.cells[0]["seeds"] == [0, 1, 2] and res.cells[0]["varies with the seed"]
    assert not any("greedy" in n for n in res.notes)


def test_graders_read_only_the_generated_text_of_a_chat_prompt(tmp_path, tiny):
    recipe = tmp_path / "chat.toml"  # no protocol: the chat template, whose system prompt has its own \boxed{}
    recipe.write_text('name = "chat"\ntable = "1"\nbenchmarks = ["math500"]\nconditions = ["w/o", "w/ Mless"]\n')
    with pytest.warns(lp.evals.ErrorRowsWarning):  # problem 2 with the filler does not fit the tiny context
        res = lp.reproduce(str(recipe), tiny, out=tmp_path / "o", limit=2, max_new_tokens=4, progress=False)
    rows = [r for r in _rows(tmp_path / "o" / "runs" / "math500") if r["finish"] != "error"]
    assert rows and all("\\boxed{}" in r["prompt"] for r in rows)
    unboxed = [r for r in rows if "boxed" not in r["generation"]]
    assert unboxed and all(grade_paper_exact(r["prompt"] + r["generation"], r["answer"]) for r in unboxed)
    for r in rows:  # what would be the prompt's empty box, accepted for every problem, is never read
        assert r["paper-exact"] == grade_paper_exact(r["generation"], r["answer"])
    wo = [r for r in rows if r["condition"] == "w/o"]
    got = res.table[res.table["run: samples graded"].notna()].set_index("condition")
    assert got.loc["w/o", "run: accuracy (authors' grader)"] == round(
        100 * sum(r["paper-exact"] for r in wo) / len(wo), 1) < 100
    assert any("without the authors' protocol" in r for r in res.cells[0]["reasons"])
    # the error row: no verdict, n one lower, and the cell says so
    assert got.loc["w/o", "run: samples graded"] == 2 and got.loc["w/ Mless", "run: samples graded"] == 1
    mless = next(c for c in res.cells if c["condition"] == "w/ Mless")
    assert mless["errors"] == 1 and any("1 error row(s) without a verdict, so 1 sample(s) fewer are graded" in r
                                        for r in mless["reasons"])


def test_another_recipes_folder_is_refused_before_anything_runs(tmp_path, tiny, capsys):
    out = tmp_path / "x"
    lp.reproduce("arm-table1", tiny, out=out, limit=1, max_new_tokens=1, progress=False)
    before = {p: p.read_bytes() for p in (out / "table.md", out / "table.csv")}
    with pytest.raises(lp.LensprobeError, match=r"holds the run of recipe 'arm-table1'.*its own folder \(e.g. --out "):
        lp.reproduce("arm-table5", tiny, out=out, limit=1, max_new_tokens=1, progress=False)
    assert {p: p.read_bytes() for p in before} == before
    lp.reproduce("arm-table1", tiny, out=out, limit=1, max_new_tokens=1, progress=False)  # its own rerun resumes
    assert main(["reproduce", "arm-table5", "--model", str(tmp_path / "no-such-model"), "--out", str(out)]) == 2
    assert "holds the run of recipe 'arm-table1'" in capsys.readouterr().err  # before the (missing) model loads


def test_recipe_names_and_redefined_conditions_are_checked(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "../../../x"\ntable = "1"\nbenchmarks = ["math500"]\nconditions = ["w/o"]\n')
    with pytest.raises(lp.LensprobeError, match=r"name '../../../x' must be letters, digits"):
        lp.load_recipe(str(bad))
    own = tmp_path / "own.toml"
    own.write_text('table = "1"\nbenchmarks = ["math500"]\nconditions = ["w/o", "w/ Mless"]\n'
                   '[define."w/ Mless"]\nbase = "w/ Mless"\ncount = 3\n')
    with pytest.raises(lp.LensprobeError, match=r"define.'w/ Mless' takes the name of a built-in condition"):
        lp.load_recipe(str(own))


def test_a_data_file_the_recipe_does_not_use_is_refused_before_the_model_loads(tmp_path, capsys):
    data = tmp_path / "aime2025.jsonl"
    data.write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n')
    argv = ["reproduce", "arm-table1", "--benchmark-data", f"aime2025={data}", "--model", str(tmp_path / "no-such-model"),
            "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "data for aime2025, which recipe 'arm-table1' does not run" in capsys.readouterr().err


def test_published_only_rows_and_the_papers_dashes(tmp_path):
    empty = pd.DataFrame(columns=["benchmark", "condition", *RUN_COLUMNS])
    t2 = beside_published(empty, lp.load_recipe("arm-table2"))
    assert {"gpqa", "livecodebench", "humaneval"} <= set(t2["benchmark"])  # shown as published, not run
    below = t2[(t2["benchmark"] == "livecodebench") & (t2["condition"] == "w/o")]
    assert below["Qwen2.5-Math-7B (Table 2)"].item() == "< 5"
    assert "| < 5 |" in markdown_table(t2)
    t4 = beside_published(empty, lp.load_recipe("arm-table4"))
    assert [c for c in t4.columns if "Table 4" in c] == ["model not named (Table 4)"]
    assert "w/ Mless (random position)" in set(t4["condition"])


def test_arm_facts_take_the_preset_of_the_models_configuration_not_its_name(tiny):
    """The preset beside a cell is the one the run took (``ARM.preset`` of the loaded model: its configuration
    first), whatever name the rows are recorded under."""
    import dataclasses

    from lensprobe.app.provenance import arm_facts
    from lensprobe.core.models.facts import model_facts
    from lensprobe.interventions.arm_presets import PRESET_ARCHITECTURES

    part = {"labels": {"interventions": [{"type": "ARM", "c": 0.1, "percentile": 95, "source": "code"}]}}
    facts = model_facts(tiny)
    qwen = dataclasses.replace(facts, name="my-run", architecture=PRESET_ARCHITECTURES["qwen2.5-math-7b"])
    found = arm_facts(part, qwen, "math500")  # no preset has this name; the configuration is Qwen2.5-Math-7B's
    assert found is not None and found["preset"] is not None
    assert (found["preset"]["c"], found["preset"]["percentile"]) == (lp.ARM.preset(qwen, "math500").c, 95)
    gemma = dataclasses.replace(facts, name=QWEN7, architecture=PRESET_ARCHITECTURES["gemma-3-27b-it"])
    found = arm_facts(part, gemma, "aime2024")  # Qwen's name, Gemma 3 27B's configuration: Gemma's preset
    assert found is not None and found["preset"]["variant"] == "gemma" == lp.ARM.preset(gemma, "aime2024").variant
    assert found["preset"]["c"] == 0.25 != arm_facts(part, QWEN7, "aime2024")["preset"]["c"]  # type: ignore[index]
    assert arm_facts(part, facts, "math500")["preset"] is None  # type: ignore[index]  # the tiny model: none
