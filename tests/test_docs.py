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
