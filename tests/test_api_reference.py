"""The HTML API reference (``make docs``, ``.ci/docs.py``): one page per module, the docstrings' roles as
working links, and a link checker that reports what leads nowhere.

The reference is built once, offline, into a temporary folder; the checker is then run on altered copies
of its pages. Whether each role names something that exists in Python is ``tests/test_docs.py``'s job.
"""

import html
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lensprobe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "docs.py"
ROLE = re.compile(r":(func|class|mod|data|meth|attr|exc|obj):`(~?)([A-Za-z_][\w.]*?)(?:\(\))?`")
XREF = re.compile(r'<code class="xref"><a href="[^"]*">([^<]*)</a></code>')


def _script():
    spec = importlib.util.spec_from_file_location("lensprobe_api_reference_build", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _modules() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(lensprobe.__path__, "lensprobe.")]
    return ["lensprobe", *(n for n in names if not n.endswith("__main__"))]


def _shown(kind: str, tilde: str, target: str) -> str:
    """How a role reads on the page: the last name for ``~``, ``()`` after a function."""
    return (target.rpartition(".")[2] if tilde else target) + ("()" if kind in ("func", "meth") else "")


def _page(out: Path, module: str) -> Path:
    return out / f"{module.replace('.', '/')}.html"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "docs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    return run, out


@pytest.fixture
def copy(built, tmp_path):
    """A copy of the built reference, to break on purpose."""
    target = tmp_path / "docs"
    shutil.copytree(built[1], target)
    return target


def test_the_build_exits_0_and_counts_its_pages(built):
    run, out = built
    assert run.returncode == 0, run.stderr
    pages = len(list(out.rglob("*.html")))
    assert f"{pages} pages written" in run.stdout
    assert "0 broken references" in run.stdout


def test_every_module_has_a_page(built):
    _, out = built
    missing = [m for m in _modules() if not _page(out, m).is_file()]
    assert not missing
    assert (out / "index.html").is_file()


def test_load_model_is_documented(built):
    _, out = built
    page = (out / "lensprobe.html").read_text(encoding="utf-8")
    assert 'id="load_model"' in page
    first_line = inspect.getdoc(lensprobe.load_model).splitlines()[0]
    first_line = ROLE.sub(lambda m: _shown(*m.groups()), first_line).replace("``", "")
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", page)))
    assert first_line in text


def test_module_docstring_roles_are_links_with_their_short_names(built):
    _, out = built
    unlinked = []
    for name in _modules():
        doc = importlib.import_module(name).__doc__ or ""
        links = [html.unescape(t) for t in XREF.findall(_page(out, name).read_text(encoding="utf-8"))]
        for role in ROLE.findall(doc):
            if (text := _shown(*role)) not in links:
                unlinked.append(f"{name}: {text}")
    assert not unlinked
    assert "~lensprobe" not in (out / "search.js").read_text(encoding="utf-8")


def test_the_checker_reports_each_link_broken_on_purpose(copy):
    page = _page(copy, "lensprobe.core.models")
    source = page.read_text(encoding="utf-8")
    assert 'href="#load_model"' in source
    broken_doc = ('<div class="docstring"><p>see :func:`nowhere`, <a href="../nowhere.html">a missing page</a>'
                  ' and <a href="#load_model"><a href="#">a link in a link</a></a></p></div>')
    page.write_text(source.replace('href="#load_model"', 'href="#no_such_anchor"', 1)
                    .replace("</body>", broken_doc + "</body>"), encoding="utf-8")
    assert sorted(_script().broken_references(copy)) == [
        ("lensprobe/core/models.html", "# (inside another link)"),
        ("lensprobe/core/models.html", "#no_such_anchor"),
        ("lensprobe/core/models.html", "../nowhere.html"),
        ("lensprobe/core/models.html", ":func:`nowhere`"),
    ]
