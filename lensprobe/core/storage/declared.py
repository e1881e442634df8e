"""User code declared by a name and a version: :func:`declare`.

A resumable run identifies what it depends on by content
(:mod:`lensprobe.core.storage.identity`). Code is the exception: a function's bytecode says nothing
of the globals it reads or of the helpers it calls, so a hook whose helper changed would have the
same identity and reuse the rows of the old one. A function or class that is neither lensprobe's nor
a known library's is therefore refused in a resumable run unless it is declared: its author gives it a
name and a version, and changes the version whenever its results change (as pyvene and SAELens
identify a run by its saved settings, not by its code).

Example:
    >>> def halve(activation, hook):
    ...     return activation * 0.5
    >>> hook = declare(halve, name="halve", version="1")
    >>> identity(hook)
    {'.declared': 'halve', 'version': '1'}
"""

from typing import Any, TypeVar

from lensprobe.core.errors import LensprobeError

__all__ = ["DECLARED", "declare", "declared_as"]

DECLARED = "__lensprobe_declared__"
"""The attribute :func:`declare` sets: ``(name, version)``."""
T = TypeVar("T")


def declare(code: T, *, name: str, version: str | int) -> T:
    """Declare the identity of a user function or class: ``name`` and ``version``, which you change
    whenever what it computes changes (its body, a helper it calls, a global it reads). Returns
    ``code`` itself, marked (usable as ``@functools.partial(declare, name=..., version=...)`` or
    called on an existing function); a declared class's instances are identified by the name, the
    version and their attributes.

    Raises:
        LensprobeError: an empty name or version, or ``code`` that cannot carry attributes.

    Example:
        >>> lp.interventions.declare(my_hook, name="my_hook", version="2")
    """
    if not isinstance(name, str) or not name.strip():
        raise LensprobeError(f"declare: name must be non-empty text, got {name!r}.")
    if isinstance(version, bool) or not isinstance(version, (str, int)) or not str(version).strip():
        raise LensprobeError(f"declare: version must be non-empty text or an integer, got {version!r}.")
    try:
        setattr(code, DECLARED, (name, str(version)))
    except (AttributeError, TypeError):
        raise LensprobeError(f"declare: {code!r} cannot carry a declared identity (a compiled function or a "
                             "built-in): wrap it in a Python function and declare that.") from None
    return code


def declared_as(obj: Any) -> tuple[str, str] | None:
    """``(name, version)`` when ``obj`` (a function, or a class) was declared; else ``None``."""
    value = getattr(obj, DECLARED, None) if DECLARED in getattr(obj, "__dict__", {}) else None
    return value if isinstance(value, tuple) and len(value) == 2 else None
