"""mkdocs hook: one API reference page per public module of lensprobe, generated from the docstrings.

Each page is a generated file ``reference/<dotted.name>.md`` holding one mkdocstrings directive
(``::: lensprobe.core.models.loading``); ``reference/index.md`` lists them, and the nav's "API reference" section
gets one entry per module, grouped by subpackage. Public means: no part of the dotted name starts with
``_`` (``__main__`` is skipped). The package is listed from its files, so nothing is imported here.
"""

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


def _index(modules: list[str]) -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings (Google style) by mkdocstrings: one page per public module. "
             "Most of what a study needs is exported from the package itself: start at "
             f"[`lensprobe`]({PACKAGE}.md).", ""]
    for name in modules:
        lines.append(f"- [`{name}`]({name}.md)")
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
    files.append(File.generated(config, "reference/index.md", content=_index(modules)))
    for name in modules:
        files.append(File.generated(config, page(name), content=f"::: {name}\n"))
    return files
