"""The tutorial notebooks: valid nbformat-4 files without stored outputs, and each one runs top to bottom.

Each notebook's code cells (IPython lines starting with ``!`` or ``%`` left out) are written to one script
that runs in a fresh interpreter in a temporary folder, offline, as a reader would run the notebook; the
files the notebook saves (report, traces, sweep table, evaluation rows) are then checked.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

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
    try:
        import nbformat
    except ImportError:  # the structural checks above cover the schema's essentials
        pass
    else:
        nbformat.validate(nbformat.from_dict(nb))
    # a title saying what it answers, then how to install
    assert cells[0]["cell_type"] == "markdown" and _source(cells[0]).startswith("# ")
    assert "**Question:**" in _source(cells[0])
    setup = _source(cells[1])
    assert cells[1]["cell_type"] == "markdown" and "pip install -e ." in setup and "make demo" in setup
    compile(notebook_script(nb), name, "exec")


def test_readme_lists_every_notebook():
    readme = (TUTORIALS / "README.md").read_text(encoding="utf-8")
    on_disk = sorted(p.name for p in TUTORIALS.glob("*.ipynb"))
    assert on_disk == sorted(NOTEBOOKS)
    for name in NOTEBOOKS:
        assert name in readme, f"tutorials/README.md does not list {name}"


# ----- running them ---------------------------------------------------------------------------


def check_01(cwd: Path) -> None:
    """The HTML report with its three figures, the circuitsvis view and the tables behind them."""
    import pandas as pd

    report = cwd / "filler-report"
    page = (report / "index.html").read_text(encoding="utf-8")
    assert "Filler tokens and attention" in page and "lp-attention-view" in page
    manifest = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert manifest["sections"][0]["n_figures"] == 3
    table = pd.read_csv(report / "filler-tokens-and-attention" / "attention-received.csv")
    assert set(table["condition"]) == {"none", "meaningless", "meaningful"}
    assert set(table["layer"]) == {0, 1}
    props = pd.read_csv(report / "filler-tokens-and-attention" / "proportions.csv")
    assert props["onto system"].between(0, 1).all()


def check_02(cwd: Path) -> None:
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


def check_03(cwd: Path) -> None:
    """The sweep table covers layers 0-2 (27 heads) and nothing else."""
    import pandas as pd

    table = pd.read_csv(cwd / "sweep" / "entropy_sweep.csv", index_col="layer")
    assert table.shape == (30, 9)
    assert table.loc[[0, 1, 2]].notna().all().all() and table.loc[3:].isna().all().all()
    long = pd.read_csv(cwd / "sweep" / "entropy_sweep_long.csv")
    assert len(long) == 27 and (long["change"] != 0).any()


def check_04(cwd: Path) -> None:
    """3 problems x 3 conditions, each written once (the rerun resumed), and the rebuilt report."""
    out = cwd / "runs" / "smol"
    lines = (out / "results-rank0.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 9
    assert {r["condition"] for r in rows} == {"w/o", "w/ Mless", "w/ Mful"}
    assert all(r["level"] == 1 and r["generated_tokens"] <= 48 for r in rows)
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (out / "report" / "index.html").is_file()


CHECKS = dict(zip(NOTEBOOKS, (check_01, check_02, check_03, check_04), strict=True))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, request):
    extra_env = {}
    if name.startswith("04_"):  # the local MATH-500 file (the fixture fails clearly when it is missing)
        extra_env["LENSPROBE_MATH500"] = str(request.getfixturevalue("math500_path"))
    run_notebook(name, tmp_path, extra_env)
    CHECKS[name](tmp_path)
