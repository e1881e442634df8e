"""mkdocs hook: the API reference, generated from the docstrings.

``reference/index.md`` is the curated entry page (it replaces the file of that name in ``docs/``, which
says where the reference is to readers on GitHub): the public names by group (the top level, then each
namespace by role: ``lp.models``, ``lp.prompts``, ...), one line each (the first line of the name's
docstring), read from the ``__all__`` lists. Each public module (no part of its dotted name starts with
``_``) also has a page ``reference/<dotted.name>.md`` holding one mkdocstrings directive; the nav lists
them after the overview, grouped by subpackage, as the modules behind the public names. Nothing is
imported here: names, their sources and docstrings are read from the files with ``ast``.
"""

import ast
from pathlib import Path

from mkdocs.structure.files import File

PACKAGE = "lensprobe"
ROOT = Path(__file__).resolve().parents[2]


def public_modules() -> list[str]:
    """Dotted names of the package and its public submodules, sorted."""
    names = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts):
            names.append(".".join(parts))
    return sorted(names)


def page(name: str) -> str:
    return f"reference/{name}.md"


NAMESPACES = ("models", "prompts", "interventions", "metrics", "generation", "experiments", "studies", "evals",
              "viz")
"""The namespaces by role, in the order the overview lists them."""


def _module_file(module: str) -> Path:
    base = ROOT / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _all_and_sources(module: str) -> tuple[list[str], dict[str, str]]:
    """A module's ``__all__`` and, for each name it imports, the module it comes from."""
    tree = ast.parse(_module_file(module).read_text(encoding="utf-8"))
    names: list[str] = []
    sources: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for alias in node.names:
                sources[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY_FUNCTIONS" for t in node.targets):
            sources.update(ast.literal_eval(node.value))  # names imported on first use: name -> module
    return names, sources


def _summary(module: str, name: str, depth: int = 0) -> tuple[str, str]:
    """``(defining module, first docstring line)`` of ``name`` as ``module`` exports it."""
    path = _module_file(module)
    if not path.exists():
        return module, ""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            doc = ast.get_docstring(node) or ""
            return module, doc.strip().splitlines()[0] if doc.strip() else ""
    _, sources = _all_and_sources(module)
    if name in sources and depth < 4:
        return _summary(sources[name], name, depth + 1)
    if (ROOT / Path(*module.split("."), name)).is_dir() or _module_file(f"{module}.{name}").exists():
        doc = ast.get_docstring(ast.parse(_module_file(f"{module}.{name}").read_text(encoding="utf-8"))) or ""
        return f"{module}.{name}", doc.strip().splitlines()[0] if doc.strip() else ""
    return module, ""


def _entries(module: str) -> list[tuple[str, str, str]]:
    """``(name, defining module, first docstring line)`` of each name in ``module``'s ``__all__``."""
    names, _ = _all_and_sources(module)
    return [(name, *_summary(module, name)) for name in names]


def _group(title: str, entries: list[tuple[str, str, str]], prefix: str, shortcuts: dict[tuple[str, str], str]) -> list[str]:
    lines = [f"## {title}", ""]
    for name, where, line in entries:
        also = shortcuts.get((where, name))
        text = f"- [`{prefix}{name}`]({where}.md)" + (f": {line}" if line else "")
        lines.append(text + (f" (top level: `{also}`)" if also else ""))
    return [*lines, ""]


def _index(modules: list[str]) -> str:
    """The overview: each public object once, under its one namespace path; a top-level shortcut is named on
    its namespace entry, and the top level's own group lists only what lives there alone."""
    lines = ["# API reference", "",
             "`import lensprobe as lp` gives what the README's examples use at the top level; everything else "
             "public is in a namespace by role. Each public object is listed once, under its one namespace path "
             "(with its top-level shortcut, if it has one), in one line (its docstring's first line), linked to "
             "the page of the module that defines it. The modules listed in the navigation are the "
             "implementation behind these names.", ""]
    spaces = {ns: _entries(f"{PACKAGE}.{ns}") for ns in NAMESPACES}
    homes = {(where, name) for entries in spaces.values() for name, where, _ in entries}
    top = _entries(PACKAGE)
    shortcuts = {(where, name): f"lp.{name}" for name, where, _ in top if (where, name) in homes}
    lines += _group("Top level (`lp`)", [e for e in top if (e[1], e[0]) not in homes], "lp.", {})
    for ns in NAMESPACES:
        lines += _group(f"`lp.{ns}`", spaces[ns], f"lp.{ns}.", shortcuts)
    return "\n".join(lines) + "\n"


def on_config(config, **kwargs):
    modules = public_modules()
    groups: dict[str, list] = {}
    for name in modules:
        parts = name.split(".")
        key = parts[1] if len(parts) > 1 else ""
        groups.setdefault(key, []).append({name: page(name)})
    section = [{"Overview": "reference/index.md"}, *groups.pop("", [])]
    section += [{f"{PACKAGE}.{key}": entries} for key, entries in groups.items()]
    for i, entry in enumerate(config["nav"]):
        if isinstance(entry, dict) and "API reference" in entry:
            config["nav"][i] = {"API reference": section}
    return config


def on_files(files, config, **kwargs):
    modules = public_modules()
    pointer = files.get_file_from_path("reference/index.md")  # the page readers on GitHub see
    if pointer is not None:
        files.remove(pointer)
    files.append(File.generated(config, "reference/index.md", content=_index(modules)))
    for name in modules:
        files.append(File.generated(config, page(name), content=f"::: {name}\n"))
    return files
