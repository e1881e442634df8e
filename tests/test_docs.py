"""Docstrings: every cross-reference (``:func:``, ``:class:``, ``:mod:``, ...) names something that exists."""

import dataclasses
import importlib
import inspect
import pkgutil
import re

import lensprobe

ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj):`~?([A-Za-z_][\w.]*)(?:\(\))?`")


def _modules():
    for info in pkgutil.walk_packages(lensprobe.__path__, "lensprobe."):
        if not info.name.endswith("__main__"):  # running it would start the command line
            yield importlib.import_module(info.name)


def _docstrings(mod):
    """(owner, docstring) of the module, its classes and functions, and the classes' members."""
    yield None, mod.__doc__ or ""
    for obj in vars(mod).values():
        if getattr(obj, "__module__", None) != mod.__name__ or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        yield obj, obj.__doc__ or ""
        if inspect.isclass(obj):
            for member in vars(obj).values():
                fn = getattr(member, "fget", getattr(member, "__func__", member))
                if inspect.isfunction(fn):
                    yield obj, fn.__doc__ or ""


def _lookup(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif name in fields and name == parts[-1]:
                return True
            else:
                return False
        return True
    return False


def _resolves(target: str, mod, owner) -> bool:
    if target.startswith("lensprobe"):
        return _lookup(target)
    scopes = [f"{mod.__name__}.{owner.__name__}"] if inspect.isclass(owner) else []
    return any(_lookup(f"{scope}.{target}") for scope in [*scopes, mod.__name__, "lensprobe"])


def test_every_docstring_cross_reference_resolves():
    broken = [f"{mod.__name__}: {getattr(owner, '__qualname__', '(module)')} -> {target}"
              for mod in _modules() for owner, doc in _docstrings(mod) for target in ROLE.findall(doc)
              if not _resolves(target, mod, owner)]
    assert not broken, "broken cross-references:\n" + "\n".join(broken)


def test_the_checker_finds_a_broken_reference():
    assert _resolves("generate", lensprobe, None) and _resolves("lensprobe.generation.loop.generate", lensprobe, None)
    assert not _resolves("generate_everything", lensprobe, None)
    assert not _resolves("lensprobe.generation.loop.nothing", lensprobe, None)


# --------------------------------------------------------------------------- the docs' code blocks
# README.md, CONTRIBUTING.md and docs/*.md: every ``python`` block runs as a test (Sybil, root conftest.py).
# Blocks fenced ``python notest`` only illustrate (a GPU, the hub, a long run); they are not collected.
# Their number is recorded here, so adding or removing one is a visible decision.
ILLUSTRATIVE_BLOCKS = 8


def _root_conftest():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("lensprobe_root_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_illustrative_blocks_are_counted_and_every_other_python_block_is_collected(capsys):
    conf = _root_conftest()
    pages = conf.doc_pages()
    names = {p.name for p in pages}
    assert {"README.md", "CONTRIBUTING.md", "getting-started.md", "heads.md", "evaluations.md"} <= names
    infos = [(page.name, info) for page in pages for info, _ in conf.fences(page) if info.startswith("python")]
    illustrative = [page for page, info in infos if info == "python notest"]
    tested = [page for page, info in infos if info == "python"]
    odd = [(page, info) for page, info in infos if info not in ("python", "python notest")]
    assert not odd, f"python blocks with an info string Sybil would neither run nor count: {odd}"
    with capsys.disabled():
        print(f"\ndocs: {len(tested)} python blocks run as tests, {len(illustrative)} illustrative "
              f"(python notest) in {sorted(set(illustrative))}")
    assert len(illustrative) == ILLUSTRATIVE_BLOCKS, (
        f"{len(illustrative)} python notest blocks, {ILLUSTRATIVE_BLOCKS} recorded: update ILLUSTRATIVE_BLOCKS")
    assert len(tested) >= 40


CODE_COLUMN = 80
"""Characters of code that fit the docs site's content column without scrolling: mkdocs-material
(``mkdocs.yml``: ``theme: material``) lays out a 61rem grid with two 12.1rem sidebars, and its code is
0.85em monospace; measured in headless Chromium, 80 characters fit at window widths from 1280 to 1920 px."""


def test_the_code_blocks_of_the_site_s_pages_fit_its_content_column():
    conf = _root_conftest()
    pages = [p for p in conf.doc_pages() if p.name != "README.md"]  # the README is GitHub's page, not the site's
    assert {"CONTRIBUTING.md", "heads.md", "evaluations.md"} <= {p.name for p in pages}
    wide = [f"{page.name}: {len(line)} characters: {line.strip()[:60]}" for page in pages
            for _, body in conf.fences(page) for line in body.splitlines() if len(line) > CODE_COLUMN]
    assert not wide, f"code lines wider than the docs' content column ({CODE_COLUMN}):\n" + "\n".join(wide)


def test_the_readme_fits_on_a_few_screens_and_links_to_guides_that_exist():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 12_000
    links = re.findall(r"\]\(((?:docs/|CONTRIBUTING|tutorials/)[^)#]+)", readme)
    assert "docs/meaningless-tokens.md" in links and "CONTRIBUTING.md" in links
    missing = [link for link in links if not (root / link).is_file()]
    assert not missing



README_COLUMN = 100
"""The widest code line of the README's blocks: GitHub shows about 100 characters of code before it scrolls."""


def wide_code_lines(text: str, width: int) -> list[str]:
    """The lines of ``text``'s fenced code blocks longer than ``width`` characters."""
    wide, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside and len(line) > width:
            wide.append(f"{len(line)} characters: {line.strip()[:60]}")
    return wide


def test_the_readme_code_lines_fit_100_columns():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert readme.count("```") >= 10  # the blocks were read
    wide = wide_code_lines(readme, README_COLUMN)
    assert not wide, f"README code lines wider than {README_COLUMN}:\n" + "\n".join(wide)
    assert wide_code_lines("```python\n" + "x" * 101 + "\n```\nprose " + "y" * 200 + "\n", README_COLUMN) == [
        "101 characters: " + "x" * 60]

# --------------------------------------------------------------------------- the site's cross-references
def test_the_site_turns_roles_into_references_to_where_objects_are_defined():
    import sys
    from pathlib import Path

    import griffe

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_hooks"))
    try:
        import griffe_roles
    finally:
        sys.path.pop(0)
    pkg = griffe.load("lensprobe", resolve_aliases=False)
    hooks = pkg["core.hooks.attach"]
    text = "See :func:`~lensprobe.generate`, :class:`StepContext` and :func:`nowhere_at_all`."
    assert griffe_roles.rewrite(text, hooks, pkg) == (
        "See [`generate()`][lensprobe.generation.loop.generate], "
        "[`StepContext`][lensprobe.core.hooks.hookpoint.StepContext] and "
        "[`nowhere_at_all()`][nowhere_at_all].")  # names nothing: autorefs reports it, the strict build fails
