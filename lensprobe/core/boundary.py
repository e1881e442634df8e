"""The public boundary: what escapes a public function is one :class:`~lensprobe.core.errors.LensprobeError`.

Each public namespace (``lp.prompts``, ``lp.evals``, ``lp.viz``, ...) and the top level pass their
names through :func:`guard_public` where they are assembled: a public function becomes a wrapper
(the same wrapper wherever the function is public, keeping its ``__wrapped__``, name, signature and
docstring) that lets lensprobe's own errors, warnings, ``KeyboardInterrupt`` and ``SystemExit``
through unchanged and turns any other exception (a ``KeyError``, ``TypeError``, ``RecursionError``,
``PermissionError`` from inside) into one :class:`~lensprobe.core.errors.UnexpectedError` of one line,
naming the function, the input and the fix. The error is also an instance of the original class where
Python allows it (``except KeyError`` still catches it) and is chained ``from`` the original, so the
traceback keeps the cause.

Example:
    >>> guard_public(globals())  # at the end of a namespace's ``__init__.py``, after ``__all__``
"""

import functools
import inspect
from collections.abc import Callable, MutableMapping
from typing import Any

from lensprobe.core.errors import LensprobeError, UnexpectedError

PASSED_THROUGH = (LensprobeError, Warning)
"""Exceptions a public function raises unchanged (``KeyboardInterrupt`` and ``SystemExit`` are no
``Exception``: they are never caught)."""

_WRAPPERS: dict[Callable, Callable] = {}
_ERROR_CLASSES: dict[type, type] = {}


def guard_public(namespace: MutableMapping[str, Any]) -> None:
    """Replace each function of lensprobe named in ``namespace["__all__"]`` by its boundary wrapper."""
    for name in namespace["__all__"]:
        obj = namespace.get(name)
        if obj is not None and inspect.isfunction(obj) and obj.__module__.startswith("lensprobe"):
            namespace[name] = public_function(obj, f"{namespace['__name__'].replace('lensprobe', 'lp', 1)}.{name}")


def public_function(fn: Callable, where: str) -> Callable:
    """``fn`` behind the public boundary, its errors naming ``where`` (its public path, ``lp.evals.grade``):
    one wrapper per function, so every public path of it is one object."""
    if getattr(fn, "__lensprobe_boundary__", False) or not inspect.isfunction(fn):
        return fn
    if fn not in _WRAPPERS:

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except PASSED_THROUGH:
                raise
            except Exception as err:
                raise translated(err, where) from err

        wrapper.__lensprobe_boundary__ = True  # type: ignore[attr-defined]
        _WRAPPERS[fn] = wrapper
    return _WRAPPERS[fn]


def translated(err: Exception, where: str, fix: str | None = None) -> UnexpectedError:
    """``err``, raised inside ``where``, as one line naming the input and the fix (``fix``: what to check,
    instead of the general advice for an exception of its kind)."""
    error = _error_class(type(err))
    message = f"{where}: {type(err).__name__}: {_first_line(err)}: {fix}" if fix else _message(err, where)
    try:
        out = error(message)
    except TypeError:  # a class whose constructor needs more than a message (UnicodeDecodeError)
        out = UnexpectedError(message)
    if isinstance(err, OSError) and isinstance(out, OSError):
        out.errno, out.strerror, out.filename = err.errno, err.strerror, err.filename
    return out


def _error_class(cls: type) -> type:
    if cls not in _ERROR_CLASSES:
        try:
            _ERROR_CLASSES[cls] = type(f"Unexpected{cls.__name__}", (UnexpectedError, cls),
                                       {"__module__": UnexpectedError.__module__})
        except TypeError:  # bases whose layouts cannot be combined
            _ERROR_CLASSES[cls] = UnexpectedError
    return _ERROR_CLASSES[cls]


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(lines) if lines else type(err).__name__


def _message(err: Exception, where: str) -> str:
    if isinstance(err, RecursionError):
        return (f"{where}: an input is nested too deeply (Python's recursion limit): give data nested at most a "
                "few dozen levels deep.")
    if isinstance(err, PermissionError):
        return (f"{where}: permission denied on {err.filename or 'a file or folder'}: choose a folder you can "
                "write to (or change its permissions).")
    if isinstance(err, OSError):
        what = f"cannot use {err.filename}" if err.filename else "a file operation failed"
        return (f"{where}: {what}: {err.strerror or _first_line(err)}. Check the path, its permissions and the free "
                "disk space.")
    if isinstance(err, KeyError):
        return (f"{where}: missing key {_first_line(err)}: check the names in the arguments (and the keys of the "
                "data or files given).")
    return (f"{where}: unexpected {type(err).__name__}: {_first_line(err)}. Check the arguments' types and values "
            f"against help({where}); if they are right, this is a bug of lensprobe: please report it with the "
            "traceback.")
