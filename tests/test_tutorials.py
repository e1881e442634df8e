"""The tutorial notebooks: valid nbformat-4 files without stored outputs whose imports are all installed,
and each one runs top to bottom.

Each notebook's code cells (IPython lines starting with ``!`` or ``%`` left out) are written to one script
that runs in a fresh interpreter in a temporary folder, offline, as a reader would run the notebook; the
files the notebook saves (report, traces, sweep table, evaluation rows) are then checked. The checks of
the files themselves are fast; running the notebooks is slow. A missing dependency (``nbformat`` from the
``dev`` extra, or anything a notebook imports) fails these tests; nothing is skipped.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
NOTEBOOKS = [
    "01_filler_tokens_and_attention.ipynb",
    "02_generation_traces_and_latent_thinking.ipynb",
    "03_head_ablation_and_patching.ipynb",
    "04_math500_evaluation.ipynb",
]
TIMEOUT = 600


def _load(name: str) -> dict:
    return json.loads((TUTORIALS / name).read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def notebook_script(nb: dict) -> str:
    """The notebook's code cells as one script, IPython-only lines (``!cmd``, ``%magic``) dropped."""
    blocks = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = [ln for ln in _source(cell).splitlines() if not ln.lstrip().startswith(("!", "%"))]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def run_notebook(
    name: str, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    script = cwd / (Path(name).stem + ".py")
    script.write_text(notebook_script(_load(name)), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        {
            "OMP_WAIT_POLICY": "PASSIVE",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra_env or {})
    try:
        proc = subprocess.run(
            [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as err:
        tail = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        tail = tail[-3000:]
        pytest.fail(f"{name} did not finish within {TIMEOUT} s; stderr tail:\n{tail}")
    assert proc.returncode == 0, (
        f"{name} failed (exit code {proc.returncode}).\n--- stderr (tail) ---\n{proc.stderr[-4000:]}"
        f"\n--- stdout (tail) ---\n{proc.stdout[-1500:]}"
    )
    return proc


# ----- the files themselves -------------------------------------------------------------------


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_valid_nbformat4_without_outputs(name):
    nb = _load(name)
    assert nb["nbformat"] == 4 and isinstance(nb["nbformat_minor"], int)
    assert isinstance(nb["metadata"], dict) and nb["metadata"]["kernelspec"]["language"] == "python"
    cells = nb["cells"]
    assert cells and all(c["cell_type"] in ("markdown", "code") for c in cells)
    for cell in cells:
        assert isinstance(cell["metadata"], dict) and isinstance(cell["source"], (str, list))
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{name}: a code cell has stored outputs"
            assert cell["execution_count"] is None, f"{name}: a code cell has an execution count"
        else:
            assert "outputs" not in cell and "execution_count" not in cell
    ids = [c.get("id") for c in cells]
    assert all(ids) and len(set(ids)) == len(ids), f"{name}: cell ids must be present and unique"
    nbformat.validate(nbformat.from_dict(nb))  # the full nbformat-4 schema
    # a title saying what it answers, then how to install
    assert cells[0]["cell_type"] == "markdown" and _source(cells[0]).startswith("# ")
    assert "**Question:**" in _source(cells[0])
    setup = _source(cells[1])
    assert cells[1]["cell_type"] == "markdown" and "pip install -e ." in setup and "make demo" in setup
    compile(notebook_script(nb), name, "exec")


def imported_modules(script: str) -> set[str]:
    """Top-level names of the modules a script needs: its imports, except those inside a ``try`` that
    handles ``ImportError`` (optional extras such as IPython's display)."""
    tree = ast.parse(script)
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_module_a_notebook_imports_is_installed(name):
    modules = imported_modules(notebook_script(_load(name)))
    assert "lensprobe" in modules
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{name} imports {missing}, which is not installed: add it to pyproject.toml"


def test_readme_lists_every_notebook():
    readme = (TUTORIALS / "README.md").read_text(encoding="utf-8")
    on_disk = sorted(p.name for p in TUTORIALS.glob("*.ipynb"))
    assert on_disk == sorted(NOTEBOOKS)
    for name in NOTEBOOKS:
        assert name in readme, f"tutorials/README.md does not list {name}"


# ----- running them ---------------------------------------------------------------------------


def check_01(cwd: Path, stdout: str, math500: Path) -> None:
    """The HTML report with its three figures, the circuitsvis view and the tables behind them."""
    import pandas as pd

    report = cwd / "filler-report"
    page = (report / "index.html").read_text(encoding="utf-8")
    assert "Filler tokens and attention" in page and "lp-attention-view" in page
    manifest = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert manifest["sections"][0]["n_figures"] == 3
    table = pd.read_csv(report / "filler-tokens-and-attention" / "attention-received.csv")
    assert set(table["condition"]) == {"w/o", "w/ Mless", "w/ Mful"}
    assert set(table["layer"]) == {0, 1}
    props = pd.read_csv(report / "filler-tokens-and-attention" / "proportions.csv")
    assert props["onto system"].between(0, 1).all()


def check_02(cwd: Path, stdout: str, math500: Path) -> None:
    """The saved traces load back; only the thinking settings took thinking steps."""
    import lensprobe as lp

    plain = lp.load_trace(cwd / "traces" / "plain.parquet")
    assert plain.n_steps == 32 and set(plain.tracked) == {"system", "question", "generated"}
    steps = {}
    for label in ("LatentFusion", "Pause", "no_thinking"):
        tr = lp.load_trace(cwd / "traces" / f"{label}.parquet")
        assert tr.n_rows == 2 and "thinking" in tr.tracked
        steps[label] = int(tr.thinking_rows.sum())
    assert steps["LatentFusion"] > 0 and steps["no_thinking"] == 0
    assert (cwd / "trace.html").stat().st_size > 10_000


def check_03(cwd: Path, stdout: str, math500: Path) -> None:
    """The sweep table covers layers 0-2 (27 heads) and nothing else."""
    import pandas as pd

    table = pd.read_csv(cwd / "sweep" / "entropy_sweep.csv", index_col="layer")
    assert table.shape == (30, 9)
    assert table.loc[[0, 1, 2]].notna().all().all() and table.loc[3:].isna().all().all()
    long = pd.read_csv(cwd / "sweep" / "entropy_sweep_long.csv")
    assert len(long) == 27 and (long["change"] != 0).any()


def check_04(cwd: Path, stdout: str, math500: Path) -> None:
    """The first 3 level-1 problems x 3 conditions, each row written once (the rerun generated nothing,
    the other setting was refused), and the report rebuilt from the saved rows."""
    out = cwd / "runs" / "smol"
    lines = (out / "results-rank0.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    raw = [json.loads(line) for line in math500.read_text(encoding="utf-8").splitlines()]
    first3 = [r["unique_id"] for r in raw if r["level"] == 1][:3]
    keys = sorted((r["condition"], r["problem_id"]) for r in rows)
    assert keys == sorted((c, i) for c in ("w/o", "w/ Mless", "w/ Mful") for i in first3)  # each exactly once
    answers = {r["unique_id"]: r["answer"] for r in raw}
    assert all(r["answer"] == answers[r["problem_id"]] and 1 <= r["generated_tokens"] <= 48 for r in rows)
    assert "nothing generated: True" in stdout and "refused:" in stdout
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert set(config["conditions"]) == {"w/o", "w/ Mless", "w/ Mful"}
    assert (out / "report" / "index.html").is_file()


CHECKS = dict(zip(NOTEBOOKS, (check_01, check_02, check_03, check_04), strict=True))


@pytest.mark.slow  # each notebook loads the embedded model in a fresh process
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, math500_path):
    # every notebook reads the shared MATH-500 file (the fixture fails clearly when it is missing)
    proc = run_notebook(name, tmp_path, {"LENSPROBE_MATH500": str(math500_path)})
    CHECKS[name](tmp_path, proc.stdout, math500_path)
