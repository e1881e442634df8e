"""The documentation of a dataclass's fields, read from its source: a field's ``metadata["help"]``, else
the docstring under it, else its entry in the ``Attributes:`` or ``Args:`` section of the class
docstring (base classes included). The command line's help is made from it
(:mod:`lensprobe.app.parsing`), and so are the fields of :func:`~lensprobe.core.given.given_settings`.

Example:
    >>> field_docs(EvalConfig)["batch_size"][:23]
    'rows generated at once;'
"""

import ast
import dataclasses
import inspect
import re
import textwrap

__all__ = ["field_docs"]


def _section_docs(doc: str | None) -> dict[str, str]:
    """``name -> text`` of the entries of a Google-style ``Attributes:`` or ``Args:`` section."""
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in inspect.cleandoc(doc or "").splitlines():
        width = len(line) - len(line.lstrip())
        if re.fullmatch(r"(Attributes|Args):", line.strip()):
            indent, names = width, []
        elif indent is not None and line.strip() and width <= indent:
            indent, names = None, []  # the section ended
        elif indent is not None and (entry := re.fullmatch(r"\s*([\w*]+(?:, [\w*]+)*):\s*(.*)", line)) \
                and width <= indent + 4:
            names = [n.lstrip("*") for n in entry.group(1).split(", ")]
            docs.update(dict.fromkeys(names, entry.group(2)))
        elif names and line.strip():
            docs.update({n: f"{docs[n]} {line.strip()}" for n in names})
    return docs


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """``name -> docstring`` of the fields followed by a string in the class body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # a class without source: no attribute docstrings
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    return {node.target.id: inspect.cleandoc(after.value.value) for node, after in zip(body, body[1:], strict=False)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)}


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation: its ``metadata["help"]``, else the docstring under it, else its entry
    in the class docstring's ``Attributes:`` / ``Args:`` section; a subclass's wins over its bases'.

    Example:
        >>> field_docs(EvalConfig)["batch_size"][:23]
        'rows generated at once;'
    """
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if k is not object]):
        docs.update(_section_docs(klass.__doc__))
        docs.update(_attribute_docstrings(klass))
    docs.update({f.name: f.metadata["help"] for f in dataclasses.fields(cls) if "help" in f.metadata})
    return docs
