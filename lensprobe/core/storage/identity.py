"""The identity of anything a run depends on, by content: :func:`identity` and :func:`identity_digest`
(a run's whole identity, and the rule it was identified under: :mod:`lensprobe.core.storage.runidentity`).

Every resumable run (evaluations, ablation sweeps, patching, trace sets) records the identity of
what it depends on (the model, prompts, interventions, metrics, settings) and refuses a folder
whose identity differs. Identities describe content, never ``repr()`` or names:

- an object that declares its own identity: its ``__lensprobe_identity__()`` (JSON-able data
  that determines its results), under its type's qualified name; a user class's data holds a
  ``"version"`` (or the class is declared with :func:`~lensprobe.core.storage.declared.declare`), else
  it is refused;
- a dataclass: its type's qualified name and every field, defaults included (so a folder
  written under an old default never matches a run under a new one), each by identity; a field
  declared ``field(..., metadata={"identity": False})`` (labels that cannot change results) is
  left out;
- tensors, numpy arrays and bytes: a digest of their content (shape, dtype, every value; a
  :class:`~lensprobe.core.prompts.prompt.Prompt` declares a digest of its text, tokens and segments); a model (any ``torch.nn.Module``): a digest of every
  parameter and buffer (:func:`weights_digest`, computed from the values at every call: an edit
  through ``.data`` changes it), with its dtype and shape beside;
- mappings and sequences item by item; numbers (by value: ``95.0`` is ``95``), strings, ``None`` and
  booleans as they are;
- a function of a library (``torch``, ``math``, the builtins ...): its name; a function of
  lensprobe: its qualified name and lensprobe's version, its defaults and the identity of every
  closure cell (so ``scale(1.0)`` and ``scale(40.0)`` differ); a bound method by its object and
  function; ``functools.partial`` by function, arguments and keywords;
- user code (a function or class of neither lensprobe nor a known library): by the name and
  version it is declared with (:func:`~lensprobe.core.storage.declared.declare`), with its defaults,
  closure cells or attributes; undeclared, it is refused: its bytecode cannot show the globals it
  reads or the helpers it calls, whose change would reuse rows computed by other code;
- an instance of a lensprobe class: its type's qualified name and its ``vars()``, each by identity.

Anything else (undeclared user code, a C object with no declared identity, a builtin of an
unknown library, a cycle) is refused with a :class:`~lensprobe.core.errors.LensprobeError` naming it: a guess
could reuse another run's results.

Example:
    >>> identity(lp.ablate_heads("L0H3"))["heads"]
    [[0, 3]]
    >>> identity_digest(torch.zeros(2)) == identity_digest(torch.zeros(2))
    True
"""

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import math
import types
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.declared import declared_as
from lensprobe.core.version import __version__

__all__ = ["IDENTITY_METHOD", "IDENTITY_VERSION", "IdentityError", "identity", "identity_digest", "weights_digest"]

IDENTITY_VERSION = 2
"""The identity rule folders record (``"identity"`` in their settings); folders written before it
identified runs by ``repr()`` and the model's name (rule 1: by code and by the settings that
differ from their defaults), and are refused (:func:`lensprobe.core.storage.runidentity.check_identity_rule`)."""
IDENTITY_METHOD = "__lensprobe_identity__"
LIBRARIES = ("builtins", "math", "cmath", "operator", "_operator", "functools", "itertools", "statistics",
             "torch", "numpy", "einops", "transformers", "transformer_lens")
"""Top-level modules whose functions are identified by their name (their code is the library's)."""
HOW_TO = (f"give its class a {IDENTITY_METHOD}() method returning JSON-able data that determines its "
          "results, or make it a dataclass")


class IdentityError(LensprobeError):
    """Something a run depends on cannot be identified by content (the message names it and says how
    to describe it). A resumable run refuses it; a run kept in memory may go on without an identity."""


def identity(obj: Any, where: str = "") -> Any:
    """The identity of ``obj`` as JSON-able data: equal for equal content, in every process.

    See the module's documentation for how each kind of object is described. ``where`` names
    ``obj`` in errors (e.g. ``"condition 'x' interventions"``).

    Raises:
        LensprobeError: ``obj`` holds something that cannot be described (named in the
            message, with how to describe it).

    Example:
        >>> def scale(factor):
        ...     return lambda x: x * factor
        >>> identity(scale(1.0)) == identity(scale(40.0))
        False
    """
    return _describe(obj, where, frozenset())


def identity_digest(obj: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of :func:`identity` as sorted JSON.

    Example:
        >>> identity_digest({"a": 1, "b": 2}) == identity_digest({"b": 2, "a": 1})
        True
    """
    text = json.dumps(identity(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of every parameter and buffer of ``module``: names, shapes, dtypes and values.

    Computed from the values at every call, never cached: an edit through ``.data`` (which no
    tensor version counter sees) changes it. SHA-256 ran at 0.46 to 1.11 GB/s on one CPU core: 0.5
    to 1.2 s for the embedded 135M-parameter model in float32 (538 MB), about 13 to 30 s for a 7B
    model in bf16 (14 GB); ``docs/numerics.md``.

    Example:
        >>> weights_digest(model) == weights_digest(model)
        True
    """
    h = hashlib.sha256()
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        h.update(f"{name}{tuple(t.shape)}{t.dtype};".encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- describing


def _describe(obj: Any, where: str, active: frozenset[int]) -> Any:
    if obj is None or type(obj) in (bool, str, int):
        return obj
    if type(obj) is float:  # by value: 95.0 is 95 (a setting typed on the command line or in Python)
        if not math.isfinite(obj):
            return {".float": str(obj)}
        return int(obj) if obj.is_integer() and abs(obj) < 2**53 else obj
    declared = getattr(type(obj), IDENTITY_METHOD, None)
    if declared is not None and not isinstance(obj, type):
        return _self_declared(obj, declared(obj), where, active)
    content = _content(obj)
    if content is not None:
        return content
    if id(obj) in active:
        raise _refuse(obj, where, "it contains itself (a cycle)")
    active = active | {id(obj)}
    for kinds, describe in _DESCRIBERS:
        if isinstance(obj, kinds):
            return describe(obj, where, active)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if declared_as(type(obj)) is None and not _ours(type(obj).__module__):
            raise _undeclared(obj, _qualname(type(obj)), where)
        return _dataclass(obj, where, active)
    if isinstance(obj, Mapping):
        return _mapping(obj, where, active)
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return _instance(obj, state, where, active)
    raise _refuse(obj, where, "it has no declared identity and no attributes to describe it by")


def _self_declared(obj: Any, data: Any, where: str, active: frozenset[int]) -> dict:
    """An object by its own ``__lensprobe_identity__()`` data. A user class (neither lensprobe's, whose version its
    code is, nor a known library's) must say which version of its code made the data: a ``"version"`` in it, or
    the class declared (:func:`~lensprobe.core.storage.declared.declare`); else it is refused, as an undeclared
    user function is."""
    cls = type(obj)
    out = {".type": _qualname(cls), ".identity": _describe(data, where, active)}
    declared = declared_as(cls)
    if declared is not None:
        return {**out, ".declared": declared[0], "version": declared[1]}
    if not (_ours(cls.__module__) or _library(cls.__module__)) and not (isinstance(data, Mapping) and "version" in data):
        short = cls.__name__
        at = f" at {where}" if where else ""
        raise IdentityError(
            f"cannot identify {_qualname(cls)}{at}: its {IDENTITY_METHOD}() returns no 'version', and it is user "
            "code (neither lensprobe's nor a known library's), so a change of its code would reuse rows computed by "
            f"the old one. Return a version with its data ({{'version': '1', ...}}, changed whenever its results "
            f"change), or declare the class: lp.interventions.declare({short}, name={short!r}, version='1'); or run "
            "with out=None (kept in memory, nothing reused).")
    return out


def _content(obj: Any) -> Any:
    """Objects described by a digest of their content, or by a name that fixes them; else ``None``."""
    if isinstance(obj, torch.Tensor):
        return {".tensor": _digest(str(obj.dtype).encode(), _tensor_bytes(obj)), "shape": list(obj.shape),
                "dtype": str(obj.dtype)}
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and hasattr(obj, "tobytes"):
        array = obj.__array__() if hasattr(obj, "__array__") else obj
        if array.dtype.kind == "O":  # Python objects: their bytes are addresses
            return {".array": _describe(array.tolist(), "", frozenset()), "shape": list(array.shape)}
        return {".array": _digest(array.tobytes()), "shape": list(array.shape), "dtype": str(array.dtype)}
    if isinstance(obj, torch.nn.Module):
        return {".type": _qualname(type(obj)), "weights": weights_digest(obj), **_model_labels(obj)}
    if isinstance(obj, enum.Enum):
        return {".enum": _qualname(type(obj)), "name": obj.name}
    if isinstance(obj, type):
        return {".class": _qualname(obj)}
    if isinstance(obj, types.ModuleType):
        return {".pymodule": obj.__name__}
    if isinstance(obj, inspect.Signature):  # held by lensprobe's decorators
        return {".signature": str(obj)}
    if isinstance(obj, (torch.dtype, torch.device)):
        return {".torch": str(obj)}
    if isinstance(obj, PurePath):
        return {".path": obj.as_posix()}
    if isinstance(obj, (bytes, bytearray)):
        return {".bytes": _digest(bytes(obj))}
    if obj is Ellipsis:
        return {".ellipsis": True}
    if isinstance(obj, complex):
        return {".complex": [_describe(obj.real, "", frozenset()), _describe(obj.imag, "", frozenset())]}
    if isinstance(obj, (int, float, str)):  # subclasses (numpy scalars are caught above)
        plain = int(obj) if isinstance(obj, int) else float(obj) if isinstance(obj, float) else str(obj)
        return _describe(plain, "", frozenset())
    return None


def _model_labels(module: torch.nn.Module) -> dict:
    first = next(iter(module.parameters()), None)
    labels: dict[str, Any] = {"dtype": str(first.dtype) if first is not None else None}
    cfg = getattr(module, "cfg", None)
    for name in ("n_layers", "n_heads", "d_model", "d_vocab"):
        if isinstance(getattr(cfg, name, None), int):
            labels[name] = int(getattr(cfg, name))
    return labels


def _sequence(obj, where: str, active: frozenset[int]) -> list:
    return [_describe(v, f"{where}[{i}]", active) for i, v in enumerate(obj)]


def _set(obj, where: str, active: frozenset[int]) -> dict:
    items = [_describe(v, f"{where}{{}}", active) for v in obj]
    return {".set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}


def _mapping(obj: Mapping, where: str, active: frozenset[int]) -> dict:
    if all(isinstance(k, str) for k in obj):  # as it is: identities of identities are themselves
        return _fields(obj, where, active)
    pairs = [[_describe(k, f"{where} key", active), _describe(v, f"{where}[{k!r}]", active)] for k, v in obj.items()]
    return {".mapping": sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))}


def _fields(state: Mapping[str, Any], where: str, active: frozenset[int]) -> dict:
    return {k: _describe(v, f"{where}.{k}" if where else k, active) for k, v in state.items()}


def _dataclass(obj, where: str, active: frozenset[int]) -> dict:
    out: dict[str, Any] = {".type": _qualname(type(obj))}
    for f in dataclasses.fields(obj):
        if f.metadata.get("identity", True):  # every field, defaults included
            out[f.name] = _describe(getattr(obj, f.name), f"{where}.{f.name}" if where else f.name, active)
    return out


def _slice(obj, where: str, active: frozenset[int]) -> dict:
    return {f".{type(obj).__name__}": _sequence([obj.start, obj.stop, obj.step], where, active)}


def _partial(obj: functools.partial, where: str, active: frozenset[int]) -> dict:
    return {".partial": _describe(obj.func, f"{where}.func", active), "args": _sequence(obj.args, where, active),
            "keywords": _mapping(obj.keywords, where, active)}


def _method(obj: types.MethodType, where: str, active: frozenset[int]) -> dict:
    return {".method": _describe(obj.__func__, where, active), "self": _describe(obj.__self__, f"{where}.__self__",
                                                                                   active)}


def _function(fn: types.FunctionType, where: str, active: frozenset[int]) -> dict:
    name = f"{fn.__module__}.{fn.__qualname__}"
    if _library(fn.__module__):
        return {".function": name}
    declared = declared_as(fn)
    wrapped = getattr(fn, "__wrapped__", None)
    if declared is None and isinstance(wrapped, types.FunctionType):  # a decorator's wrapper: the function it wraps
        return _describe(wrapped, where, active)
    if declared is not None:
        out: dict[str, Any] = {".declared": declared[0], "version": declared[1]}
    elif _ours(fn.__module__):
        out = {".function": name, "lensprobe": __version__}
    else:
        raise _undeclared(fn, name, where)
    if fn.__defaults__:
        out["defaults"] = _sequence(fn.__defaults__, f"{where} (defaults of {name})", active)
    if fn.__kwdefaults__:
        out["kwdefaults"] = _mapping(fn.__kwdefaults__, f"{where} (defaults of {name})", active)
    if fn.__closure__:
        cells = {}
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=True):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                raise _refuse(fn, where, f"its closure variable {var!r} is empty") from None
            cells[var] = _describe(value, f"{where} (closure variable {var!r} of {name})", active)
        out["closure"] = cells
    return out


def _instance(obj: Any, state: Mapping[str, Any], where: str, active: frozenset[int]) -> dict:
    """An instance by its type and attributes: lensprobe's classes as they are, a user class when declared."""
    cls = type(obj)
    declared = declared_as(cls)
    if declared is not None:
        return {".declared": declared[0], "version": declared[1], **_fields(state, where, active)}
    if not (_ours(cls.__module__) or _library(cls.__module__)):
        raise _undeclared(obj, _qualname(cls), where)
    return {".type": _qualname(cls), **_fields(state, where, active)}


def _undeclared(obj: Any, name: str, where: str) -> IdentityError:
    short = getattr(obj, "__name__", type(obj).__name__)
    at = f" at {where}" if where else ""
    return IdentityError(
        f"cannot identify {name}{at}: it is user code (neither lensprobe's nor a known library's), and what it "
        "computes depends on more than its bytecode (the globals it reads, the helpers it calls), so a change would "
        f"reuse rows computed by other code. Declare it: lp.interventions.declare({short}, name={short!r}, "
        "version='1') on the function or class (change the version whenever its results change), or give its class "
        f"a {IDENTITY_METHOD}() method; or run with out=None (kept in memory, nothing reused).")


def _builtin(obj, where: str, active: frozenset[int]) -> dict:
    owner = getattr(obj, "__self__", None)
    module = getattr(obj, "__module__", None) or getattr(getattr(obj, "__objclass__", None), "__module__", None)
    if module is None and owner is not None:
        module = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__module__
    if not _library(module):
        raise _unknown_builtin(obj, where)
    name = f"{module}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"
    if owner is not None and not isinstance(owner, (types.ModuleType, type)):
        return {".method": name, "self": _describe(owner, f"{where}.__self__", active)}
    return {".function": name}


def _unknown_builtin(obj, where: str) -> IdentityError:
    return _refuse(obj, where, "it is a compiled function of a library lensprobe does not know (its code cannot be "
                               "read); wrap it in a Python function or a dataclass with __call__")


_DESCRIBERS: tuple = (
    ((list, tuple), _sequence), ((set, frozenset), _set), ((slice, range), _slice),
    (functools.partial, _partial), (types.MethodType, _method), (types.FunctionType, _function),
    ((types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType, types.MethodWrapperType,
      types.MethodDescriptorType, types.ClassMethodDescriptorType), _builtin),
)


# ----------------------------------------------------------------------------- helpers


def _tensor_bytes(t: torch.Tensor) -> Any:
    """The values of ``t`` as its raw bytes (a buffer, not copied again for hashing)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def _digest(*chunks: Any) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)
    return h.hexdigest()[:16]


def _library(module: str | None) -> bool:
    return bool(module) and str(module).split(".")[0] in LIBRARIES


def _ours(module: str | None) -> bool:
    return str(module).split(".")[0] == "lensprobe"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _refuse(obj: Any, where: str, why: str, how: bool = True) -> IdentityError:
    at = f" at {where}" if where else ""
    fix = f": {HOW_TO}" if how else ""
    return IdentityError(
        f"cannot identify {_qualname(type(obj))}{at}: {why}. A resumable run identifies everything it depends on "
        f"by content or declaration, so that a folder is never reused for another run{fix}."
    )
