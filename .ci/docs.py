"""Build lensprobe's HTML API reference with pdoc and check its cross-references.

``python .ci/docs.py [--out build/docs]`` writes one page per public module of lensprobe (the package is
walked, so modules that an ``__all__`` leaves out get a page too; ``__main__`` is skipped), then reads the
pages back and exits with code 1, naming the page and the link, when

- an ``href`` inside the reference points to a page that was not written or to an ``#anchor`` that no
  element of that page carries,
- a link is opened inside another link, or
- a docstring still shows a reST role such as ``:func:`...```.

Docstrings are Google style and write cross-references as reST roles (``:func:`~lensprobe.generate```).
pdoc turns a role into plain code (``lensprobe.generate()``), keeps the ``~``, and links the name only
when it is spelled out in full or defined in the page's own module. So the build resolves each role
itself, the way ``tests/test_docs.py`` does (the owning class, then the defining module, then
``lensprobe``), and writes it as a link to the page and anchor where pdoc documents the target, its
text shortened to the last name for ``~``. A role that names nothing documented is left as role text,
which the check then reports.
"""

from __future__ import annotations

import argparse
import html
import importlib
import pkgutil
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path
from unittest import mock
from urllib.parse import unquote, urlsplit

import jinja2
import pdoc
import pdoc.render
import pdoc.search
from pdoc.extract import walk_specs
from pdoc.render_helpers import relative_link, to_markdown

PACKAGE = "lensprobe"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "docs"
DOCFORMAT = "google"
ROLE = re.compile(r":(?:py:)?(func|class|mod|data|meth|attr|exc|obj):`(~?)([A-Za-z_][\w.]*?)(?:\(\))?`")
LEFT_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|exc|obj):`[^`]*`")
CALLABLE_ROLES = ("func", "meth")

# pdoc's module page, with every docstring's roles turned into links before pdoc converts it.
MODULE_TEMPLATE = """{% extends "default/module.html.jinja2" %}
{% macro docstring(var) %}
    {% if var.docstring %}
        <div class="docstring">{{ var | expand_roles | replace("@public", "") | to_markdown | to_html
            | linkify(namespace=var.qualname, shorten=False) }}</div>
    {% endif %}
{% endmacro %}
"""


def public_modules(package: str = PACKAGE) -> list[str]:
    """The package and every submodule whose dotted name has no part starting with ``_``, sorted."""
    root = importlib.import_module(package)
    names = [info.name for info in pkgutil.walk_packages(root.__path__, f"{package}.")]
    return sorted([package, *(n for n in names if not any(p.startswith("_") for p in n.split(".")))])


def pdoc_specs(modules: Iterable[str]) -> list[str]:
    """The fewest module names to hand to pdoc so that each of ``modules`` is rendered exactly once.

    pdoc renders a package's submodules too, unless its ``__all__`` leaves them out: a module that pdoc
    already reaches from an earlier name is not passed again (that would render it twice).
    """
    specs: list[str] = []
    reached: set[str] = set()
    for name in sorted(modules):
        if name not in reached:
            specs.append(name)
            reached.update(walk_specs([name]))
    return specs


def _lookup(dotted: str) -> object | None:
    """The Python object named by ``dotted`` (a module, then attributes), or ``None``."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return None
            obj = getattr(obj, name)
        return obj
    return None


def locate(dotted: str, all_modules: dict, is_public: Callable[[object], bool]) -> tuple[str, str] | None:
    """``(module, qualname)`` of the page and anchor where pdoc documents ``dotted``; qualname ``""``
    for a module. Looks under the name as written, then where the named object is defined."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = all_modules.get(".".join(parts[:i]))
        if module is not None:
            qualname = ".".join(parts[i:])
            if not qualname:
                return module.modulename, ""
            doc = module.get(qualname)
            if doc is not None and is_public(doc):
                return module.modulename, qualname
            break
    obj = _lookup(dotted)
    home = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(home, str) and isinstance(qualname, str) and home in all_modules:
        doc = all_modules[home].get(qualname)
        if doc is not None and is_public(doc):
            return home, qualname
    return None


def scopes(doc) -> list[str]:
    """Where a short role target is looked up from ``doc``'s docstring: its class, its module, the package."""
    module, qualname = doc.taken_from
    owner = qualname if doc.kind == "class" else qualname.rpartition(".")[0]
    return [*([f"{module}.{owner}"] if owner else []), module, PACKAGE]


def role_text(kind: str, tilde: str, target: str) -> str:
    """How a role reads: the last name for ``~``, the target as written otherwise; ``()`` after a function."""
    return (target.rpartition(".")[2] if tilde else target) + ("()" if kind in CALLABLE_ROLES else "")


def role_link(match: re.Match, doc, context) -> str:
    """HTML for one role: a link to the target's page and anchor, or the role text when nothing matches."""
    kind, tilde, target = match.groups()
    candidates = [target] if target.startswith(f"{PACKAGE}.") or target == PACKAGE else [
        f"{scope}.{target}" for scope in scopes(doc)]
    is_public = lambda d: bool(context["is_public"](d).strip())  # noqa: E731
    for dotted in candidates:
        found = locate(dotted, context["all_modules"], is_public)
        if found is None:
            continue
        page, anchor = found
        here = context["module"].modulename
        href = relative_link(here, page) or ("" if anchor else f"{here.rpartition('.')[2]}.html")
        href += f"#{anchor}" if anchor else ""
        text = role_text(kind, tilde, target)
        # pdoc's linkify later links every dotted name in a docstring's HTML, inside attributes and links
        # too: each "." written as an entity (which a browser reads as ".") keeps it off this link.
        href, text = href.replace(".", "&#46;"), html.escape(text).replace(".", "&#46;")
        return f'<code class="xref"><a href="{href}">{text}</a></code>'
    # Entities keep pdoc and Markdown from rewriting the role: the page shows it as written.
    return match.group(0).replace(":", "&#58;").replace("`", "&#96;")


def expand_roles(context, doc) -> str:
    """``doc``'s docstring with every reST role replaced by :func:`role_link`'s HTML (a Jinja filter)."""
    return ROLE.sub(lambda m: role_link(m, doc, context), doc.docstring)


def plain_roles(docstring: str) -> str:
    """Roles as code without a link (``:func:`~a.b``` -> ``b()``), for the search index's snippets."""
    return ROLE.sub(lambda m: f"`{role_text(*m.groups())}`", docstring)


def build(out: Path, modules: list[str]) -> list[Path]:
    """Render ``modules`` with pdoc into ``out`` (its earlier lensprobe pages are removed); the pages."""
    for stale in (out / PACKAGE, out / f"{PACKAGE}.html", out / "index.html", out / "search.js"):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as templates:
        (Path(templates) / "module.html.jinja2").write_text(MODULE_TEMPLATE)
        # No "View Source" listings: highlighting them takes half the build and doubles the pages' size.
        pdoc.render.configure(docformat=DOCFORMAT, show_source=False, search=True,
                              template_directory=Path(templates))
        pdoc.render.env.filters["expand_roles"] = jinja2.pass_context(expand_roles)
        # The search index converts docstrings on its own, without the template: plain roles there.
        plain = lambda docstring, *rest: to_markdown(plain_roles(docstring), *rest)  # noqa: E731
        with warnings.catch_warnings(record=True) as caught, mock.patch("pdoc.search.to_markdown", plain):
            warnings.simplefilter("always")
            pdoc.pdoc(*pdoc_specs(modules), output_directory=out)
    for warning in caught:
        print(f"pdoc warning: {warning.message}", file=sys.stderr)
    return sorted(out.rglob("*.html"))


class _Page(HTMLParser):
    """One page's element ids, link targets, links opened inside another link, and docstring text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.nested: list[str] = []
        self.docstrings: list[str] = []
        self._links = 0  # open <a> elements
        self._depth = 0  # open <div>s inside the current docstring, 0 outside one

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key])
        if values.get("href") is not None:
            self.hrefs.append(values["href"])
        if tag == "a":
            if self._links and values.get("href") is not None:
                self.nested.append(values["href"])
            self._links += 1
        if tag == "div" and (self._depth or "docstring" in (values.get("class") or "").split()):
            self._depth += 1
            if self._depth == 1:
                self.docstrings.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._links:
            self._links -= 1
        if tag == "div" and self._depth:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.docstrings[-1] += data


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def broken_references(out: Path) -> list[tuple[str, str]]:
    """``(page, link)`` for every link in ``out``'s pages that does not resolve or sits inside another
    link, and every role left in a docstring; pages are named relative to ``out``."""
    root = out.resolve()
    pages = {path.resolve(): _parse(path) for path in sorted(root.rglob("*.html"))}
    broken: list[tuple[str, str]] = []
    for path, page in pages.items():
        name = path.relative_to(root).as_posix()
        for href in page.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc:
                continue  # outside the reference
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target not in pages and not (target.is_relative_to(root) and target.is_file()):
                broken.append((name, href))
            elif parts.fragment and (target not in pages or unquote(parts.fragment) not in pages[target].ids):
                broken.append((name, href))
        broken += [(name, f"{href} (inside another link)") for href in page.nested]
        broken += [(name, role) for text in page.docstrings for role in LEFT_ROLE.findall(text)]
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: build/docs)")
    args = parser.parse_args(argv)
    modules = public_modules()
    pages = build(args.out, modules)
    written = {p.relative_to(args.out).with_suffix("").as_posix().replace("/", ".") for p in pages}
    broken = [(f"{m.replace('.', '/')}.html", "(page not written)") for m in modules if m not in written]
    broken += broken_references(args.out)
    for page, link in broken:
        print(f"broken reference: {page}: {link}", file=sys.stderr)
    print(f"{len(pages)} pages written to {args.out} ({len(modules)} modules), "
          f"{len(broken)} broken references")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
