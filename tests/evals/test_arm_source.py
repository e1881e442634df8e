"""``--arm-source paper`` alone gives Table 9's settings in every cell where the paper and the released code
differ (:data:`~lensprobe.interventions.arm_presets.DISAGREEMENTS`), in ``lensprobe eval``, ``lp.evaluate``
and ``lp.reproduce``; without it the code's settings run. The ARM that ran and its source are recorded in
``config.json`` beside the condition's identity, which holds the numbers only.

The expected values are read from the disagreement listing's own text (``"0.13, 95.0 (Table 9)"``), not from
the preset function under test.
"""

import json
import re

import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.models.testing import tiny_hf_model
from lensprobe.core.storage.identity import identity
from lensprobe.interventions.arm_presets import DISAGREEMENTS, PAPER_TABLE9, benchmark_key

NAMES = {"gemma-3-4b-it": "gemma-3-4b-it", "gemma-3-27b-it": "gemma-3-27b-it",
         "qwen2.5-7b-instruct": "Qwen2.5-7B-Instruct", "llama-3.1-8b-instruct": "Llama-3.1-8B-Instruct"}


def _values(text: str) -> list[float]:
    """The numbers before the parenthesis: ``"0.13, 95.0 (Table 9)"`` -> ``[0.13, 95.0]``."""
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text.split("(")[0])]


def _cells() -> list[tuple[str, str, dict, dict]]:
    """``(model, benchmark, paper settings, code settings)`` for every disagreeing cell; "every benchmark"
    is each benchmark where Table 9 has a setting for the model."""
    cells = []
    for bench, model, setting, paper, code in DISAGREEMENTS:
        names = [n.strip() for n in setting.split(",")]
        benches = [b for b, cell in PAPER_TABLE9[model].items() if cell is not None] if bench == "every benchmark" \
            else [benchmark_key(bench)]
        for b in benches:
            cells.append((model, b, dict(zip(names, _values(paper), strict=True)),
                          dict(zip(names, _values(code), strict=True))))
    return cells


CELLS = _cells()
IDS = [f"{m}-{b}" for m, b, _, _ in CELLS]


def test_the_cells_cover_every_disagreement_and_differ():
    assert {(m, b) for m, b, _, _ in CELLS} >= {(m, benchmark_key(b)) for b, m, *_ in DISAGREEMENTS
                                                   if b != "every benchmark"}
    assert len(CELLS) == 3 + sum(c is not None for c in PAPER_TABLE9["llama-3.1-8b-instruct"].values())
    for _, _, paper, code in CELLS:
        assert paper.keys() == code.keys() and paper != code


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny model saved under each disagreeing model's name (its name picks the preset)."""
    hf, tok = tiny_hf_model(seed=0)
    root = tmp_path_factory.mktemp("models")
    for name in NAMES.values():
        hf.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


@pytest.fixture(scope="module")
def problem_file(tmp_path_factory):
    p = lp.load_math500(limit=1)[0]
    path = tmp_path_factory.mktemp("data") / "one.jsonl"
    path.write_text(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n")
    return path


def _ran(folder) -> dict:
    """The ARM condition's record in a run folder: its identity and its labels (every field, the source)."""
    part = json.loads((folder / "config.json").read_text())["parts"]["ARM"]
    (label,) = part["labels"]["interventions"]
    assert label["type"] == "ARM"
    fields = {k: v for k, v in label.items() if k not in ("type", "source")}
    assert part["interventions"] == identity([lp.ARM(**fields)])  # the identity is the numbers, not the source
    return label


def _check(label: dict, expected: dict, source: str) -> None:
    assert label["source"] == source
    for name, value in expected.items():
        got = label[name]
        if label["variant"] == "gemma" and name == "percentile" and value > 1:
            value /= 100  # Table 9 prints Gemma's quantile as a percent
        assert got == pytest.approx(value, abs=1e-12), name


@pytest.mark.parametrize(("model", "bench", "paper", "code"), CELLS, ids=IDS)
@pytest.mark.parametrize("source", ["paper", "code", None])
def test_eval_command_runs_the_sources_settings(folders, problem_file, tmp_path, model, bench, paper, code, source):
    out = tmp_path / "run"
    argv = ["eval", "--model", str(folders / NAMES[model]), "--data", str(problem_file), "--benchmark", bench,
            "--conditions", "ARM", "--max-new-tokens", "1", "--no-progress", "--out", str(out)]
    assert main(argv + (["--arm-source", source] if source else [])) == 0
    _check(_ran(out), paper if source == "paper" else code, source or "code")


@pytest.mark.parametrize(("model", "bench", "paper", "code"), CELLS, ids=IDS)
@pytest.mark.parametrize("source", ["paper", "code"])
def test_evaluate_runs_the_sources_settings(folders, tmp_path, model, bench, paper, code, source):
    m = lp.load_model(folders / NAMES[model])
    lp.evaluate(m, lp.load_math500(limit=1), "ARM", out=tmp_path / "run", benchmark=bench, arm_source=source,
                max_new_tokens=1, progress=False)
    _check(_ran(tmp_path / "run"), paper if source == "paper" else code, source)


@pytest.mark.parametrize(("model", "bench", "paper", "code"), CELLS, ids=IDS)
@pytest.mark.parametrize("source", ["paper", "code"])
def test_reproduce_runs_the_sources_settings(folders, problem_file, tmp_path, model, bench, paper, code, source):
    recipe = tmp_path / "cell.toml"
    recipe.write_text(f'title = "one cell"\nkind = "table"\narxiv = "2510.01032"\ntable = "2"\n'
                      f'protocol = "arm-math500"\nbenchmarks = ["{bench}"]\nconditions = ["ARM"]\n'
                      f'models = ["{NAMES[model]}"]\n')
    m = lp.load_model(folders / NAMES[model])
    lp.reproduce(recipe, m, out=tmp_path / "out", data={bench: problem_file}, max_new_tokens=1, arm_source=source,
                 progress=False)
    _check(_ran(tmp_path / "out" / "runs" / bench), paper if source == "paper" else code, source)


@pytest.mark.parametrize("source", ["paper", None])
def test_reproduce_command_passes_the_source(folders, problem_file, tmp_path, source):
    model, bench, paper, code = next(c for c in CELLS if c[0] == "qwen2.5-7b-instruct")
    recipe = tmp_path / "cell.toml"
    recipe.write_text(f'title = "one cell"\nkind = "table"\narxiv = "2510.01032"\ntable = "2"\n'
                      f'protocol = "arm-math500"\nbenchmarks = ["{bench}"]\nconditions = ["ARM"]\n'
                      f'models = ["{NAMES[model]}"]\n')
    argv = ["reproduce", str(recipe), "--model", str(folders / NAMES[model]), "--benchmark-data", f"{bench}={problem_file}",
            "--max-new-tokens", "1", "--no-progress", "--out", str(tmp_path / "out")]
    assert main(argv + (["--arm-source", source] if source else [])) == 0
    _check(_ran(tmp_path / "out" / "runs" / bench), paper if source else code, source or "code")


def test_settings_given_start_from_the_sources_preset(folders, problem_file, tmp_path):
    """``--arm-c`` on top of the paper's preset keeps Table 9's percentile (Qwen2.5-7B-Instruct, AIME 2025)."""
    model, bench, paper, _ = next(c for c in CELLS if c[0] == "qwen2.5-7b-instruct")
    out = tmp_path / "run"
    assert main(["eval", "--model", str(folders / NAMES[model]), "--data", str(problem_file), "--benchmark", bench,
                 "--conditions", "ARM", "--max-new-tokens", "1", "--no-progress", "--out", str(out),
                 "--arm-source", "paper", "--arm-c", "0.3"]) == 0
    label = _ran(out)
    assert (label["c"], label["percentile"], label["source"]) == (0.3, paper["percentile"], "paper")


def test_evaluate_refuses_an_unknown_source(tiny):
    # the test session's runtime type checks refuse it at the call, lensprobe's own check otherwise
    with pytest.raises(Exception, match=r"arm_source"):
        lp.evaluate(tiny, lp.load_math500(limit=1), "w/o", arm_source="table", max_new_tokens=1, progress=False)


def test_reproduce_help_names_only_its_own_options_and_explains_the_source(capsys):
    assert main(["reproduce", "--help"]) == 0
    text = capsys.readouterr().out
    assert not re.search(r"--benchmark(?!-data)\b", text)  # reproduce takes its benchmarks from the recipe
    source_help = text[text.index("  --arm-source {code,paper}"):]
    assert "no other --arm-* option" in " ".join(source_help.split())
