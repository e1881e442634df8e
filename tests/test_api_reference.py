"""The docs site (``make docs``: ``mkdocs build --strict``): it builds offline with no warning, every public
module has an API reference page generated from its docstrings, the docstrings' reST roles are links, and
every figure a guide embeds was drawn by the build.

The site is built once into a temporary folder (about a minute: the figures are computed on the embedded
SmolLM2). Whether each role names something that exists in Python is ``tests/test_docs.py``'s job.
"""

import html
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lensprobe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ROLE = re.compile(r":(func|class|mod|data|meth|attr|exc|obj):`(~?)([A-Za-z_][\w.]*?)(?:\(\))?`")
IFRAME = re.compile(r'<iframe src="\.\./figures/([\w-]+\.html)"')


def _modules() -> list[str]:
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import api_pages
    finally:
        sys.path.pop(0)
    return api_pages.public_modules()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "docs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    return run, out


def _text(page: Path) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8"))))


def test_the_strict_build_exits_0_without_warnings(built):
    run, out = built
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    assert (out / "index.html").is_file()


def test_every_public_module_has_a_reference_page(built):
    _, out = built
    modules = _modules()
    assert "lensprobe.core.models.loading" in modules and "lensprobe.__main__" not in modules
    missing = [m for m in modules if not (out / "reference" / m / "index.html").is_file()]
    assert not missing


def test_load_model_is_documented_from_its_docstring(built):
    _, out = built
    page = out / "reference" / "lensprobe.core.models.loading" / "index.html"
    assert 'id="lensprobe.core.models.loading.load_model"' in page.read_text(encoding="utf-8")
    first_line = inspect.getdoc(lensprobe.load_model).splitlines()[0]
    first_line = ROLE.sub(lambda m: m.group(3).rpartition(".")[2] if m.group(2) else m.group(3), first_line)
    assert first_line.replace("``", "") in _text(page).replace("()", "")


def test_docstring_roles_are_rendered_as_links_not_role_text(built):
    _, out = built
    left = [str(p.relative_to(out)) for p in (out / "reference").rglob("*.html")
            if ":func:`" in p.read_text(encoding="utf-8") or ":class:`" in p.read_text(encoding="utf-8")]
    assert not left
    page = (out / "reference" / "lensprobe.core.hooks.attach" / "index.html").read_text(encoding="utf-8")
    # hooks.py's module docstring says :func:`intervene`: a link to its anchor on the same page
    assert 'href="#lensprobe.core.hooks.attach.intervene"' in page


def test_every_embedded_figure_was_drawn_by_the_build(built):
    _, out = built
    embedded = {name for page in (ROOT / "docs").glob("*.md") for name in IFRAME.findall(page.read_text())}
    assert {"attention_received.html", "sweep.html", "thinking_trace.html"} <= embedded
    for name in embedded:
        figure = (out / "figures" / name).read_text(encoding="utf-8")
        assert 'src="plotly.min.js"' in figure and "Plotly.newPlot" in figure, name
    assert (out / "figures" / "plotly.min.js").stat().st_size > 1_000_000


def test_every_figure_frame_is_at_least_its_figure_s_height(built):
    """The frame of every embedded figure holds its whole layout height and the toolbar band above it."""
    from lensprobe.viz.embed import TOOLBAR_PX

    _, out = built
    frames = [(page, int(m.group(2)), m.group(1)) for page in out.rglob("*.html") if "figures" not in page.parts
              for m in re.finditer(r'<iframe src="\.\./figures/([\w-]+\.html)"[^>]*\sheight="(\d+)"',
                                   page.read_text(encoding="utf-8"))]
    assert len(frames) >= 5
    for page, frame, name in frames:
        figure = (out / "figures" / name).read_text(encoding="utf-8")
        height = int(re.search(r'class="lp-plot" data-height="(\d+)"', figure).group(1))  # the layout's height
        assert frame >= height + TOOLBAR_PX, (page, name, frame, height)
    pages = {page.parent.name for page, _, _ in frames}
    assert {"heads", "thinking", "meaningless-tokens"} <= pages


def test_the_site_needs_no_network(built):
    _, out = built
    fetched = [str(p.relative_to(out)) for p in out.rglob("*.html")
               if re.search(r'(src|href)="https?://(fonts\.googleapis|fonts\.gstatic|cdn\.)', p.read_text(encoding="utf-8"))]
    assert not fetched


def test_every_guide_heading_reaches_its_page(built):
    """A fence the Markdown extensions misread (e.g. ``python notest``) would swallow the rest of a page."""
    _, out = built
    short = []
    for page in (ROOT / "docs").glob("*.md"):
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        headings = len(re.findall(r"^## ", text, re.M))
        name = "" if page.stem == "index" else page.stem
        rendered = (out / name / "index.html").read_text(encoding="utf-8")
        if len(re.findall(r"<h2 id=", rendered)) < headings:
            short.append(page.name)
    assert not short
