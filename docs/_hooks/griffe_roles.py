"""A griffe extension: the docstrings' reST roles become mkdocstrings cross-references.

(Also: a section titled ``Example:``, as Napoleon allows, is read as griffe's ``Examples:``, so its
``>>>`` lines are shown as code.)

lensprobe's docstrings are Google style and write cross-references as reST roles
(``:func:`~lensprobe.generate```, ``:class:`Prompt```). mkdocstrings links Markdown references
(``[`generate()`][lensprobe.generation.loop.generate]``), so each role is rewritten, once the package is
loaded, into a reference to the object it names, resolved the way ``tests/test_docs.py`` checks it: a
dotted name starting with ``lensprobe`` as written, any other name in the owning class, then the
defining module, then ``lensprobe``. An alias (a name ``lensprobe/__init__.py`` re-exports) is followed
to where it is defined, which is the page that documents it.

A role that names nothing is left as it is, ``[`name`][name]``-style, so mkdocs-autorefs reports it and
``mkdocs build --strict`` fails: a broken cross-reference never reaches the site.
"""

import re

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
ROLE = re.compile(r":(?:py:)?(func|class|mod|data|meth|attr|exc|obj):`(~?)([A-Za-z_][\w.]*?)(?:\(\))?`")
CALLABLE_ROLES = ("func", "meth")


def _find(pkg: griffe.Module, dotted: str):
    """The object at ``dotted`` (``lensprobe.x.y``) in ``pkg``, aliases followed; None if nothing is there."""
    parts = dotted.split(".")
    if parts[0] != pkg.name:
        return None
    obj = pkg
    for name in parts[1:]:
        try:
            obj = obj.members[name]
        except (KeyError, AttributeError):
            return None
        try:
            obj = obj.final_target if obj.is_alias else obj
        except griffe.AliasResolutionError:
            return None
    return obj


def _scopes(obj) -> list[str]:
    """Where a relative name is looked up: the owning class, the defining module, then the package."""
    scopes = []
    holder = obj
    while holder is not None and not holder.is_module:
        if holder.is_class:
            scopes.append(holder.path)
            break
        holder = holder.parent
    module = obj if obj.is_module else obj.module
    scopes += [module.path, module.package.path]
    return scopes


def rewrite(text: str, obj, pkg: griffe.Module) -> str:
    """``text`` with every role that names something replaced by a mkdocstrings cross-reference."""

    def one(match: re.Match) -> str:
        kind, tilde, target = match.groups()
        candidates = [target] if target.startswith(pkg.name + ".") or target == pkg.name else [
            f"{scope}.{target}" for scope in _scopes(obj)]
        shown = (target.rpartition(".")[2] if tilde else target) + ("()" if kind in CALLABLE_ROLES else "")
        for candidate in candidates:
            found = _find(pkg, candidate)
            if found is not None:
                return f"[`{shown}`][{found.path}]"
        return f"[`{shown}`][{target}]"  # names nothing: autorefs reports it, the strict build fails

    return ROLE.sub(one, text)


class ReSTRoles(griffe.Extension):
    """Rewrites every docstring's roles once the whole package is loaded (so every target is known)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        seen: set[int] = set()

        def walk(obj) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                # Napoleon's singular "Example:" is griffe's "Examples:" (doctest lines become code).
                value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
                obj.docstring.value = rewrite(value, obj, pkg)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)

        walk(pkg)
