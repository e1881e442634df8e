"""What a reproduced cell is compared with: the data it ran (by digest), the published table's protocol (not the
run's), lensprobe's readings of the paper as reasons on the cell, recipes named like shipped ones, integer counts,
and ``model_name=`` choosing the ARM preset as it names the model for the verdict."""

import json
from pathlib import Path

import pandas as pd
import pytest

import lensprobe as lp
from lensprobe.app.provenance import readings, run_facts, verdict
from lensprobe.evals.results.published import paper_models, published_table, table_protocol

QWEN7 = "Qwen/Qwen2.5-Math-7B"
AIME = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "aime"


def _qwen7_facts(tiny, generation: dict) -> dict:
    """A run's facts under Qwen2.5-Math-7B's name and published configuration, with ``generation`` as recorded."""
    paper = paper_models()["qwen2.5-math-7b"]
    config = {"settings": {"model": {"weights": "x", "dtype": "torch.float32",
                                     **{k: paper[k] for k in ("n_layers", "n_heads", "d_model", "d_vocab")}},
                           "generation": generation}, "hash": "h"}
    facts = run_facts(tiny, config, name=QWEN7)
    facts["model"]["n_kv_heads"] = paper["n_kv_heads"]
    return facts


WHOLE = {"problems": 500, "of": 500, "runs": 1, "errors": 0, "arm": None}


def test_a_run_is_compared_with_the_published_tables_protocol_not_its_own(tiny):
    t08 = _qwen7_facts(tiny, {"protocol": "arm-math500-t0.5", "prompt_format": "paper", "max_new_tokens": 2048,
                             "do_sample": True, "temperature": 0.5, "top_p": 0.95, "top_k": 50, "n_samples": 5})
    assert verdict(t08, WHOLE, tiny, table="8") == (True, [])  # Table 8's own protocol
    ok, why = verdict(t08, WHOLE, tiny, table="2")  # Table 2's greedy pass@1 beside a t0.5, 5-sample run
    text = "; ".join(why)
    assert not ok and "protocol arm-math500-t0.5; Table 2's is arm-math500" in text
    assert "5 sample(s) per problem; Table 2's is 1" in text and "sampling do_sample=True" in text
    assert "temperature=0.5" in text
    # the same run judged against its own protocol (the old rule) would have been comparable
    assert verdict(t08, WHOLE, tiny) == (True, [])
    pass3 = _qwen7_facts(tiny, {"protocol": "arm-aime-pass3", "prompt_format": "paper", "max_new_tokens": 512,
                                "do_sample": True, "top_k": 50, "n_samples": 20})
    ok, why = verdict(pass3, WHOLE, tiny, table="1")  # Table 1 beside a pass@3 run: every difference named
    text = "; ".join(why)
    assert not ok and "metric pass@3; Table 1's is pass@1" in text
    assert "max_new_tokens 512; Table 1's is 2048" in text and "20 sample(s) per problem; Table 1's is 1" in text
    assert "instruction 'Please reason step by step and put your final answer within \\\\boxed{}.'" in text
    # the paper's runs come from the table, not the recipe: Table 1 averages five whatever paper_runs says
    t1 = _qwen7_facts(tiny, {"protocol": "arm-math500", "prompt_format": "paper", "max_new_tokens": 2048})
    assert table_protocol("1")["runs"] == 5
    ok, why = verdict(t1, WHOLE, tiny, table="1", paper_runs=1, random=True)
    assert not ok and why == ["1 run(s) of a cell that varies with the seed; Table 1 averages 5"]


def test_every_shipped_recipe_runs_its_tables_protocol():
    for recipe in lp.list_recipes():
        if recipe.table is None or recipe.kind != "table":
            continue
        spec = table_protocol(recipe.table, recipe.arxiv)
        assert (recipe.protocol, recipe.runs) == (spec["lensprobe"], spec["runs"]), recipe.name
    for table in ("1", "2", "3a", "3b", "4", "5", "7", "8"):
        spec = table_protocol(table)
        assert {"format", "sampling", "runs", "metric", "samples", "source"} <= set(spec)
        assert len(published_table(table))  # a protocol for every table with numbers


def test_readings_of_the_paper_are_reasons_on_the_cell(tiny):
    facts = _qwen7_facts(tiny, {"protocol": "arm-math500", "prompt_format": "paper", "max_new_tokens": 2048})
    four = readings(facts, benchmark="math500", condition="w/o", table="4")
    assert any("Table 4 does not name its model" in r and "Qwen2.5-Math-7B" in r for r in four)
    assert any("header is garbled" in r for r in readings(facts, benchmark="math500", condition="w/o", table="5"))
    best = readings(facts, benchmark="math500", condition="Best-of-N (N=5)", table="8")
    assert any("majority answer" in r for r in best)
    assert not any("majority answer" in r for r in readings(facts, benchmark="math500", condition="w/o", table="8"))
    assert any("90 problems of AIME 2022-2024" in r and "unknown" in r
               for r in readings(facts, benchmark="aime2024", condition="w/o", table="1"))
    assert any("does not say how many runs" in r
               for r in readings(facts, benchmark="math500", condition="w/o", table="2", random=True))
    weights = [r for r in readings(facts, benchmark="math500", condition="w/o", table="1") if "weights" in r]
    assert weights == [f"the weights were not verified: lensprobe ships no digest of {QWEN7}'s published weights to "
                       "compare the run's (x) with; several of the paper's models share one configuration"]


def test_a_reproduced_cell_records_its_data_and_readings(tmp_path, tiny):
    """Table 4 on the tiny model: an AIME 2025 file passed as AIME 2024 gives aime2024 ids and a reason naming its
    digest; MATH-500 from the package copy is the published file; each cell carries Table 4's reading."""
    out = tmp_path / "t4"
    res = lp.reproduce("arm-table4", tiny, out=out, limit=1, max_new_tokens=1, model_name=QWEN7, progress=False,
                       data={"aime2024": AIME / "aime2025.jsonl"})
    rows = lp.evals.load_results(out / "runs" / "aime2024")
    assert set(rows["problem_id"]) == {"aime2024-0"}
    for cell in res.cells:
        assert cell["data"]["sha256"] == published_data_digest(cell["benchmark"], cell)
        assert any("Table 4 does not name its model" in r for r in cell["readings"])
        why = "; ".join(cell["reasons"])
        if cell["benchmark"] == "aime2024":
            assert "is not AIME 2024 (the authors' 90-problem AIME 2022-2024 set)'s published file" in why
            assert "it is the published file of AIME 2025" in why
        else:
            assert "problems file" not in why
    placed = next(c for c in res.cells if c["condition"] == "w/ Mless (end of the input)")
    assert any("after_question" in r for r in placed["readings"])
    csv = pd.read_csv(out / "table.csv", dtype=str, keep_default_na=False)
    ran = csv[csv["run: samples graded"] != ""]
    assert set(ran["run: max new tokens"]) == {"1"} and set(ran["run: error rows"]) == {"0"}  # integers, not 1.0
    assert set(ran["run: samples graded"]) == {"1"} and set(ran["run: problems graded"]) == {"1"}
    assert all(v.endswith("(30 problems, 12049 bytes)") or "(500 problems" in v for v in ran["run: problems file"])
    assert all("Table 4 does not name its model" in v for v in ran["run: readings"])
    md = (out / "table.md").read_text()
    assert "it rests on: Table 4 does not name its model" in md
    saved = json.loads((out / "table.json").read_text())["cells"]
    assert all(c["data"]["sha256"] and c["readings"] for c in saved)


def published_data_digest(bench: str, cell: dict) -> str:
    """The digest of the file the cell's problems came from, computed here."""
    import hashlib

    return hashlib.sha256(Path(cell["data"]["path"]).read_bytes()).hexdigest()


def test_model_name_picks_the_arm_preset_as_it_names_the_model(tmp_path, tiny):
    skipped = lp.reproduce("arm-table3a", tiny, limit=1, max_new_tokens=1, progress=False)
    assert "ARM" not in {c["condition"] for c in skipped.cells}  # the tiny model's own name has no preset
    res = lp.reproduce("arm-table3a", tiny, limit=1, max_new_tokens=1, model_name=QWEN7, progress=False)
    arm = next(c for c in res.cells if c["condition"] == "ARM")
    assert arm["arm"]["settings"] == arm["arm"]["preset"]  # Qwen2.5-Math-7B's preset ran and is the one compared
    assert arm["arm"]["settings"]["c"] == lp.ARM.preset(QWEN7, "math500").c
    assert not any("ARM settings" in r for r in arm["reasons"])


def test_a_recipe_named_like_a_shipped_one_must_be_the_shipped_one(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('name = "arm-table1"\ntable = "1"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\n'
                    'conditions = ["w/o"]\n')
    with pytest.raises(lp.LensprobeError, match=r"its name 'arm-table1' is a shipped recipe's, but its content differs"):
        lp.load_recipe(str(mine))
    stem = tmp_path / "arm-table5.toml"  # named by its file
    stem.write_text('table = "5"\nprotocol = "arm-math500"\nbenchmarks = ["math500"]\nconditions = ["w/o"]\n')
    with pytest.raises(lp.LensprobeError, match=r"its name 'arm-table5' is a shipped recipe's"):
        lp.load_recipe(str(stem))
    shipped = Path(lp.app.recipe.__file__).parent / "recipes" / "arm-table1.toml"
    copy = tmp_path / "copy.toml"
    copy.write_text('name = "arm-table1"\n' + shipped.read_text())  # the same content: the shipped recipe
    assert lp.load_recipe(str(copy)).conditions == lp.load_recipe("arm-table1").conditions
