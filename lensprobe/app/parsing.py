"""Command-line options read from configuration dataclasses, with simple-parsing.

A command adds each of its dataclasses with :func:`add_config`; simple-parsing makes one option per
field: the flag from the name (``batch_size`` -> ``--batch-size``), the type and choices from the
annotation (a ``Literal`` gives its values), the default from the field (a field without one is a
required option; ``None`` stays ``None`` when the option is not given), the help from the docstring
under the field or its entry in the class's ``Attributes:`` section. What a field needs beyond that
is plain ``dataclasses.field`` metadata that simple-parsing reads: ``{"custom_args": {"type": ...,
"metavar": ..., "action": "append"}}``, ``{"alias": ["--sample"]}``, ``{"cmd": False}`` (not an
option). The parsed namespace holds one configuration object per dataclass, made (and so checked by
its ``__post_init__``) while parsing, and commands read the fields from those objects (``args.HeadSelection.heads``),
never from a flat namespace where two groups could collide. Two fields that would make one flag are
refused when the parser is built (``ConflictResolution.NONE``): a setting several commands share is
one dataclass (e.g. :class:`~lensprobe.experiments.head_settings.HeadSelection`) that each adds.

Renamed flags stay accepted as hidden aliases (:data:`RENAMED`): :func:`renamed_flags` rewrites them
before parsing and prints a one-line note.

Example:
    >>> parser = new_parser(prog="lensprobe sweep")
    >>> add_config(parser, AblationBatch, "batch")
    >>> add_config(parser, HeadSelection, "selection")
    >>> parser.parse_args(["--heads", "L0H1", "--heads-per-forward", "8"])
    Namespace(batch=AblationBatch(heads_per_forward=8), selection=HeadSelection(heads='L0H1'))
"""

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

import simple_parsing
from simple_parsing import ConflictResolution, DashVariant
from simple_parsing.helpers.custom_actions import BooleanOptionalAction
from simple_parsing.wrappers import DataclassWrapper, FieldWrapper

from lensprobe.core.fielddocs import field_docs

__all__ = ["PARSER_SETTINGS", "RENAMED", "ConfigHelpFormatter", "ConfigParser", "Flag", "add_config", "first_sentence", "flag_of", "new_parser", "plain",
           "renamed_flags", "setting_message", "switch_spelling"]


class ConfigHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with the option's own metavar (``--batch-size BATCH_SIZE``), ``(default: x)`` added when the
    help does not give one and there is one to give, and descriptions and examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default in (None, False, [], ()) or default is argparse.SUPPRESS
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"

    def _format_args(self, action: argparse.Action, default_metavar: str | None) -> str:
        if "." not in str(action.dest):  # an option that is not a field's
            return super()._format_args(action, default_metavar)  # type: ignore[arg-type]
        if getattr(action.type, "__name__", "") == "str2bool":
            return ""  # a flag: --no-system
        if action.choices is not None:
            return "{" + ",".join(str(c) for c in action.choices) + "}"
        given = str(action.metavar or "")
        name = given if given and not given.startswith("[") else action.dest.rsplit(".", 1)[-1].upper()
        return f"{name} [{name} ...]" if action.nargs == "+" else name

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Flag):  # a switch and its negation: --sample/--no-sample, --do-sample/--no-do-sample
            return switch_spelling(action)
        return super()._format_action_invocation(action)


def switch_spelling(action: "Flag") -> str:
    """How the help shows a switch: each spelling with its negation, ``--sample/--no-sample``; a switch that is a
    negation already shows alone (``--no-system``).

    Example:
        >>> switch_spelling(next(a for a in parser._actions if "--sample" in a.option_strings))
        '--sample/--no-sample, --do-sample/--no-do-sample'
    """
    negatives = list(action.negative_option_strings)
    positives = [s for s in action.option_strings if s not in negatives]
    return ", ".join(f"{p}/{NEGATION}{p[2:]}" if f"{NEGATION}{p[2:]}" in negatives else p for p in positives)


NEGATION = "--no-"
"""What a flag's negation starts with: ``--sample`` / ``--no-sample``."""


class Flag(BooleanOptionalAction):
    """A bool field's option and its negation, ``--no-`` in front (``--sample`` / ``--no-sample``; simple-parsing
    writes ``--nosample``). A field named ``no_<x>`` is a negation already (``--no-system``): it gets no second
    one (never ``--no-no-system``); ``--no-system false`` sets it back.

    Example:
        >>> parser.parse_args(["--no-sample"]).config.do_sample
        False
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **{**kwargs, "negative_prefix": NEGATION})
        doubled = [s for s in self.negative_option_strings if s.startswith(NEGATION + NEGATION.lstrip("-"))]
        self.option_strings = [s for s in self.option_strings if s not in doubled]
        self.negative_option_strings = [s for s in self.negative_option_strings if s not in doubled]


class _Field(FieldWrapper):
    """A field's option, a bool field's made with :class:`Flag`."""

    def get_arg_options(self) -> dict[str, Any]:
        options = super().get_arg_options()
        if options.get("action") is BooleanOptionalAction:
            options["action"] = Flag
        return options

    @property
    def arg_options(self) -> dict[str, Any]:
        """A setting that is ``None`` until given (``bool | None``, ``--sample`` alone is True) is a switch too:
        ``--sample/--no-sample``, not given: ``None``."""
        options = super().arg_options
        if "action" not in options and getattr(options.get("type"), "__name__", "") == "str2bool" \
                and options.get("nargs") == "?":
            options = {**{k: v for k, v in options.items() if k != "const"}, "action": Flag}
            self._arg_options = options
        return options


class _Group(DataclassWrapper):
    """A dataclass's options under the first line of its docstring (not ``ClassName ['dest']``), its fields'
    made by :class:`_Field`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"field_wrapper_class": _Field, **kwargs})

    @property
    def title(self) -> str:
        doc = (self.dataclass.__doc__ or self.dataclass.__name__).strip().splitlines()[0]
        return plain(doc.rstrip(".")).replace("%%", "%")

    @property
    def description(self) -> str:
        return ""


def plain(text: str) -> str:
    """``text`` on one line, reST roles and literals as plain text, ``%`` escaped for argparse."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1),
                  text)
    return " ".join(text.replace("``", "").split()).replace("%", "%%")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (``e.g.`` and ``i.e.`` do not end one), without its full stop."""
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.) (?=[A-Z0-9])", text, maxsplit=1)[0].rstrip(".")


PARSER_SETTINGS: dict[str, Any] = {"add_option_string_dash_variants": DashVariant.DASH, "add_config_path_arg": False,
                                   "formatter_class": ConfigHelpFormatter,
                                   "conflict_resolution": ConflictResolution.NONE}
"""The keywords every ``lensprobe`` parser and subparser is made with."""


class ConfigParser(simple_parsing.ArgumentParser):
    """simple-parsing's argument parser with :data:`PARSER_SETTINGS`: two fields that make one flag are an
    error when the parser is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**PARSER_SETTINGS, **kwargs})


def new_parser(**kwargs) -> ConfigParser:
    """A :class:`ConfigParser`."""
    return ConfigParser(**kwargs)


def add_config(parser: Any, cls: type, dest: str, *, prefix: str = "") -> None:
    """One option per field of the dataclass ``cls``; ``args.<dest>`` holds the ``cls`` object made
    from them (its ``__post_init__`` checks the values while parsing).

    Example:
        >>> add_config(parser, AttributionConfig, "config")
    """
    group = parser.add_arguments(cls, dest=dest, prefix=prefix, dataclass_wrapper_class=_Group)
    docs = field_docs(cls)  # the first sentence, without reST markup; also docstrings over several lines
    for wrapper in group.fields:
        if docs.get(wrapper.name):
            wrapper.help = first_sentence(plain(docs[wrapper.name]))


def flag_of(name: str) -> str:
    """The option of field ``name``: ``"batch_size"`` -> ``"--batch-size"``."""
    return "--" + name.replace("_", "-")


def setting_message(err: Exception, options: Sequence[str] = ()) -> str:
    """The message of a configuration's error with its field named as the option that sets it (among
    ``options``, the command's option strings, where a configuration was added with a prefix).

    Example:
        >>> setting_message(SettingError("batch_size", "expected a whole number >= 1, got 0"))
        'argument --batch-size: expected a whole number >= 1, got 0'
    """
    text = str(err)
    setting = getattr(err, "setting", None)
    if setting is not None:
        flag = _option(flag_of(setting), options)
        reason = getattr(err, "reason", text)
        if "{setting}" in reason:  # "{setting} takes BENCHMARK=FILE" -> "--benchmark-data takes BENCHMARK=FILE"
            return reason.replace("{setting}", flag)
        return f"argument {flag}: {reason}"
    first = re.match(r"(?:filler )?([a-z][a-z0-9]*(?:_[a-z0-9]+)*) (must|is|should)\b", text)
    if first:  # "max_new_tokens must be ..." -> "--max-new-tokens must be ..."; ARM's "c must be" -> "--arm-c must be"
        return _option(flag_of(first.group(1)), options) + text[first.end(1):]
    return text


def _option(flag: str, options: Sequence[str]) -> str:
    """``flag``, or the one option of ``options`` that is ``flag`` with a prefix (a field of a configuration added
    with one: ``--c`` is ``--arm-c``)."""
    prefixed = [o for o in options if o.endswith("-" + flag[2:]) and o.startswith("--")]
    return prefixed[0] if flag not in options and len(prefixed) == 1 else flag


RENAMED: dict[tuple[str, str], str] = {
    ("ablate", "--method"): "--ablation",
    ("sweep", "--method"): "--ablation",
    ("attribute", "--method"): "--attribution",
    ("mechanism", "--c"): "--arm-c",
    ("trace", "--samples"): "--n-samples",
    ("trace", "--alpha"): "--fusion-alpha",
    ("trace", "--token"): "--fusion-token",
    ("attention", "--count"): "--filler-count",
    ("attention", "--placement"): "--filler-placement",
    ("attention", "--seed"): "--filler-seed",
    ("mechanism", "--count"): "--filler-count",
    ("mechanism", "--seed"): "--arm-seed",
    ("attention", "--filler"): "--compare",
    ("ablate", "--top-k"): "--show-tokens",
    ("sweep", "--batch-size"): "--heads-per-forward",
    ("attribute", "--batch-size"): "--heads-per-forward",
    ("find-heads", "--batch-size"): "--heads-per-forward",
    ("attribute", "--sample"): "--random-heads",
    ("find-heads", "--sample"): "--random-heads",
    ("reproduce", "--data"): "--benchmark-data",
}
"""(command, old flag) -> its flag now; the old one still works, with a note."""


def renamed_flags(argv: Sequence[str], commands: Sequence[str]) -> list[str]:
    """``argv`` with the old spellings of :data:`RENAMED` replaced; one note on stderr per flag replaced."""
    argv = list(argv)
    command = next((a for a in argv if a in commands), None)
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        new = RENAMED.get((command or "", flag))
        if new is not None:
            print(f"lensprobe: note: `{command} {flag}` is now {new} (the old spelling will be removed)",
                  file=sys.stderr)
            arg = new + eq + value
        out.append(arg)
    return out
