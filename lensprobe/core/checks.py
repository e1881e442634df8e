"""Typed, bounded settings: one free function per kind of value, each refusing with a
:class:`~lensprobe.core.errors.SettingError` that names the field, the value and what to give instead.

A string is never read as a boolean (``do_sample="false"`` is refused, not truthy), a boolean never as a
number (``count=True`` is not 1), a float never as a whole number (``max_gen_toks=128.0``), and NaN or an
infinity never as a number. Every configuration dataclass calls :func:`check_annotated` first in its
``__post_init__`` (each field against its annotation), then the bounds of its own fields with
:func:`count`, :func:`finite_number` and :func:`choice`; the library, the recipes and the command line
all make the same dataclasses, so all three pass through the same checks.

Example:
    >>> count("n_samples", 4, 1)
    4
    >>> boolean("do_sample", "false")
    Traceback (most recent call last):
    ...
    lensprobe.core.errors.SettingError: do_sample: expected true or false (a bool), got 'false' (str)
"""

import dataclasses
import math
import numbers
import types
from collections.abc import Collection
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from lensprobe.core.errors import SettingError

__all__ = ["boolean", "check_annotated", "choice", "count", "finite_number", "integer", "typed"]


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_bool(value: Any) -> bool:
    """Python's bool or numpy's (``np.bool_``)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def boolean(field: str, value: Any) -> bool:
    """``value`` if it is a bool (numpy's too); anything else (``"false"``, ``0``, ``None``) is refused.

    Example:
        >>> boolean("stop_at_eos", True)
        True
    """
    if _is_bool(value):
        return bool(value)
    raise SettingError(field, f"expected true or false (a bool), got {_shown(value)}")


def integer(field: str, value: Any) -> int:
    """``value`` if it is a whole number (Python's or numpy's), never a bool or a float such as ``2.0``.

    Example:
        >>> integer("seed", -3)
        -3
    """
    if isinstance(value, numbers.Integral) and not _is_bool(value):
        return int(value)
    raise SettingError(field, f"expected a whole number, got {_shown(value)}")


def count(field: str, value: Any, lo: int = 0, hi: int | None = None) -> int:
    """``value`` if it is a whole number in ``[lo, hi]`` (``hi`` ``None``: no upper bound).

    Example:
        >>> count("batch_size", 8, 1)
        8
    """
    bound = f"between {lo:,} and {hi:,}" if hi is not None else f">= {lo:,}"
    try:
        number = integer(field, value)
    except SettingError:
        raise SettingError(field, f"expected a whole number {bound}, got {_shown(value)}") from None
    if number < lo or (hi is not None and number > hi):
        raise SettingError(field, f"expected a whole number {bound}, got {value!r}")
    return number


def finite_number(field: str, value: Any, lo: float | None = None, hi: float | None = None, *,
                  lo_open: bool = False, hi_open: bool = False, allow_inf: bool = False) -> float:
    """``value`` if it is a finite real number (not a bool, NaN or an infinity) within the bounds given
    (``lo_open``/``hi_open``: the bound itself excluded; ``allow_inf``: an infinity within them is taken, for a
    threshold that ``inf`` turns off; NaN never is).

    Example:
        >>> finite_number("top_p", 0.9, 0, 1, lo_open=True)
        0.9
    """
    left = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
    right = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
    bound = " and ".join(b for b in (left, right) if b)
    wanted = f"{'a number (inf allowed)' if allow_inf else 'a finite number'}{' ' + bound if bound else ''}"
    if (_is_bool(value) or not isinstance(value, numbers.Real)
            or math.isnan(value) or (math.isinf(value) and not allow_inf)):
        raise SettingError(field, f"expected {wanted}, got {_shown(value)}")
    number = float(value)
    below = lo is not None and (number <= lo if lo_open else number < lo)
    above = hi is not None and (number >= hi if hi_open else number > hi)
    if below or above:
        raise SettingError(field, f"expected {wanted}, got {value!r}")
    return number


def choice(field: str, value: Any, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices`` (compared by type too: ``True`` is not ``1``).

    Example:
        >>> choice("unit", "kv", ("head", "kv"))
        'kv'
    """
    if not any(type(value) is type(c) and value == c for c in choices):
        raise SettingError(field, f"expected one of {', '.join(map(str, choices))}, got {_shown(value)}")
    return value


def _matches(field: str, value: Any, kind: Any, allow_inf: bool) -> bool:
    """Whether ``value`` has the type ``kind`` (a bool is not an int, a float not an int)."""
    try:
        typed(field, value, kind, allow_inf=allow_inf)
    except SettingError:
        return False
    return True


def typed(field: str, value: Any, annotation: Any, *, allow_inf: bool = False) -> Any:
    """``value`` checked against a field's annotation: ``bool``, ``int``, ``float`` (finite), ``str``,
    ``Literal[...]``, a union (``X | None``), ``tuple[int, ...]``, a class (``isinstance``); ``Any``
    and what is none of these pass. ``allow_inf``: a ``float`` may be infinite (never NaN).

    Example:
        >>> typed("min_p", None, float | None) is None
        True
    """
    origin = get_origin(annotation)
    if annotation is Any or isinstance(annotation, str):
        return value
    if annotation is type(None):
        if value is not None:
            raise SettingError(field, f"expected None, got {_shown(value)}")
        return value
    if annotation is bool:
        return boolean(field, value)
    if annotation is int:
        integer(field, value)
    elif annotation is float:
        finite_number(field, value, allow_inf=allow_inf)
    elif origin is Literal:
        choice(field, value, get_args(annotation))
    elif origin in (Union, types.UnionType):
        kinds = get_args(annotation)
        if value is not None and len(kinds) == 2 and type(None) in kinds:  # X | None: X's own message
            try:
                return typed(field, value, next(k for k in kinds if k is not type(None)), allow_inf=allow_inf)
            except SettingError as err:
                raise SettingError(field, err.reason.replace(", got ", " or None, got ", 1)) from None
        if not any(_matches(field, value, kind, allow_inf) for kind in kinds):
            names = " or ".join("None" if k is type(None) else getattr(k, "__name__", str(k)) for k in kinds)
            raise SettingError(field, f"expected {names}, got {_shown(value)}")
    elif origin is tuple and isinstance(value, tuple):
        args = get_args(annotation)
        each = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(each) != len(value):
            raise SettingError(field, f"expected {len(each)} values, got {_shown(value)}")
        for item, kind in zip(value, each, strict=True):
            typed(field, item, kind, allow_inf=allow_inf)
    elif isinstance(annotation, type) and origin is None and not isinstance(value, annotation):
        raise SettingError(field, f"expected {annotation.__name__}, got {_shown(value)}")
    elif origin is not None and isinstance(origin, type) and not isinstance(value, origin):
        raise SettingError(field, f"expected {origin.__name__}, got {_shown(value)}")
    return value


def check_annotated(config: Any) -> None:
    """Every field of the dataclass instance ``config`` checked against its annotation (:func:`typed`); a
    ``float`` field whose metadata says ``{"infinite": True}`` may be infinite (a threshold ``inf`` turns off).

    Raises:
        SettingError: the first field whose value is not of its type, named.

    Example:
        >>> check_annotated(lp.GenerationConfig(8))
    """
    hints = get_type_hints(type(config))
    for f in dataclasses.fields(config):
        typed(f.name, getattr(config, f.name), hints.get(f.name, Any), allow_inf=f.metadata.get("infinite", False))
