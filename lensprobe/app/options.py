"""Command-line options generated from the fields of a dataclass, so that a setting is declared once.

For each field, :func:`add_options` adds one option:

- **name**: the field's, ``--`` and ``-`` for ``_`` (``max_new_tokens`` -> ``--max-new-tokens``);
- **type and choices**: from the annotation: ``bool`` is a flag (``store_true``; a field that defaults
  to ``True`` gets ``--x/--no-x``), a ``Literal`` gives its values as choices, ``int``, ``float``,
  ``str`` and ``Path`` convert the text, each also as ``X | None``;
- **default**: the field's (a field without one is a required option);
- **help**: ``metadata={"help": ...}``, else the docstring under the field, else its entry in the
  ``Attributes:`` or ``Args:`` section of the class docstring (base classes included): the first
  sentence, reST markup removed, with the default added when the text does not give one.

What a command needs beyond that (an argparse type that checks more, a flag of its own, ``None`` as
the default of a setting that otherwise comes from elsewhere, a note) is an :class:`Option`, given in
the field's metadata (``field(metadata=option(type=...))``) or by the command.

Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_options(parser, EvalConfig, {"batch_size": Option(type=positive_int)})
    >>> EvalConfig(**option_values(parser.parse_args(["--batch-size", "4"]), EvalConfig, ["batch_size"]))
"""

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

__all__ = ["Option", "add_options", "field_docs", "option", "option_values"]



class _NotGiven:
    """The default of :attr:`Option.default`: the field's default is the option's."""

    def __repr__(self) -> str:
        return "<the field's>"


_NOT_GIVEN: Any = _NotGiven()


@dataclass(frozen=True)
class Option:
    """How a field appears on a command line where it differs from what the field says.

    Attributes:
        flag: the option string (default: ``--`` and the field's name with ``-`` for ``_``).
        type: an argparse type (default: from the annotation).
        default: the command line's default (default: the field's); ``None`` for a setting that,
            when not given, comes from elsewhere (a protocol, the model's generation config).
        choices, metavar, required: as in ``add_argument`` (``choices`` default: a ``Literal``'s values).
        help: the help text (default: the field's documentation).
        note: a clause added to the help (e.g. what the option means under another option).
    """

    flag: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = _NOT_GIVEN
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    required: bool | None = None
    help: str | None = None
    note: str | None = None

    def merged(self, other: "Option | None") -> "Option":
        """This option with what ``other`` sets on top."""
        if other is None:
            return self
        unset = Option()
        changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(Option)
                   if getattr(other, f.name) is not getattr(unset, f.name)}
        return dataclasses.replace(self, **changes)

    def flag_of(self, name: str) -> str:
        """The option string of field ``name``."""
        return self.flag or "--" + name.replace("_", "-")

    def dest_of(self, name: str) -> str:
        """Where argparse keeps the value of field ``name`` (what ``args.<dest>`` reads)."""
        return self.flag_of(name).lstrip("-").replace("-", "_")


def option(**settings) -> dict[str, Option]:
    """Field metadata holding an :class:`Option`: ``field(default=None, metadata=option(type=out_folder))``."""
    return {"option": Option(**settings)}


# --------------------------------------------------------------------------- documentation


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


def _plain(text: str) -> str:
    """``text`` on one line, reST roles and literals as plain text, ``%`` escaped for argparse."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1),
                  text)
    return " ".join(text.replace("``", "").split()).replace("%", "%%")


def _first_sentence(text: str) -> str:
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.) (?=[A-Z0-9])", text, maxsplit=1)[0].rstrip(".")


# --------------------------------------------------------------------------- options


def _plain_type(hint: Any) -> tuple[Any, bool]:
    """``(the type without None, whether None was allowed)``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007
    return hint, False


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _NOT_GIVEN


def _help(name: str, doc: str | None, opt: Option, shown: Any, owner: str) -> str:
    if opt.help is None and doc is None:
        raise TypeError(f"{owner}.{name} has no documentation to make the help of {opt.flag_of(name)} from: "
                        "document the field, or pass Option(help=...).")
    text = _plain(opt.help) if opt.help is not None else _first_sentence(_plain(doc or ""))
    if "default" not in text and not any(shown is nothing for nothing in (None, False, _NOT_GIVEN)):
        closing = text.endswith(")") and text.count("(") == text.count(")")  # "... (when greedy; default 1.0)"
        text = f"{text[:-1]}; default {shown})" if closing else f"{text} (default {shown})"
    return f"{text}; {opt.note}" if opt.note else text


def _arguments(f: dataclasses.Field, hint: Any, opt: Option, doc: str | None, owner: str) -> dict[str, Any]:
    """The ``add_argument`` keywords of field ``f``."""
    base, _ = _plain_type(hint)
    field_default = _field_default(f)
    default = field_default if opt.default is _NOT_GIVEN else opt.default
    shown = default if default is not None else field_default
    kwargs: dict[str, Any] = {"help": _help(f.name, doc, opt, shown, owner)}
    if base is bool and opt.type is None:
        kwargs["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
    elif opt.type is not None:
        kwargs["type"] = opt.type
    elif typing.get_origin(base) is Literal:
        kwargs["choices"] = typing.get_args(base)
    elif base in (int, float, Path):
        kwargs["type"] = base
    elif base is not str:
        raise TypeError(f"{owner}.{f.name}: no command-line type for {hint!r}; pass Option(type=...).")
    if opt.choices is not None:
        kwargs["choices"] = tuple(opt.choices)
    if opt.metavar is not None:
        kwargs["metavar"] = opt.metavar
    if opt.required or (default is _NOT_GIVEN and opt.required is None):
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    return kwargs


def _chosen(cls: type, options: Mapping[str, Option | None] | Sequence[str] | None,
            changes: Mapping[str, Option]) -> dict[str, Option]:
    """Field name -> its option (metadata, then the table's, then ``changes``), in the table's order."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(options) if options is not None else list(fields)
    unknown = [n for n in [*names, *changes] if n not in fields]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}: its fields are {list(fields)}.")
    table = options if isinstance(options, Mapping) else {}
    return {n: fields[n].metadata.get("option", Option()).merged(table.get(n)).merged(changes.get(n)) for n in names}


def add_options(parser: Any, cls: type, options: Mapping[str, Option | None] | Sequence[str] | None = None, *,
                title: str | None = None, **changes: Option) -> None:
    """Add one option per field of the dataclass ``cls`` to ``parser`` (see the module docs).

    Args:
        parser: an ``argparse.ArgumentParser`` (or an argument group).
        cls: the dataclass whose fields the options set.
        options: the fields to add, in this order: names, or ``name -> Option`` (``None``: as the
            field says); default: every field.
        title: put the options in an argument group of this title in ``--help``.
        **changes: ``name -> Option`` applied on top of ``options`` (one command's defaults, flags, notes).

    Raises:
        TypeError: a field that is not in ``cls``, has no documentation or no command-line type.

    Example:
        >>> add_options(parser, GenerationConfig, GENERATION_OPTIONS, max_new_tokens=Option(default=400))
    """
    chosen = _chosen(cls, options, changes)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    target = parser.add_argument_group(title) if title else parser
    for name, opt in chosen.items():
        kwargs = _arguments(fields[name], hints[name], opt, docs.get(name), cls.__name__)
        target.add_argument(opt.flag_of(name), **kwargs)


def option_values(args: argparse.Namespace, cls: type,
                  options: Mapping[str, Option | None] | Sequence[str] | None = None, *, given: bool = False,
                  **changes: Option) -> dict[str, Any]:
    """``field -> value`` of the options :func:`add_options` added for these fields (``given``: only
    those whose value is not ``None``, i.e. the settings the command line gave).

    Example:
        >>> EvalConfig(**option_values(args, EvalConfig, EVAL_OPTIONS, given=True))
    """
    out = {}
    for name, opt in _chosen(cls, options, changes).items():
        value = getattr(args, opt.dest_of(name), None)
        if value is not None or not given:
            out[name] = value
    return out
