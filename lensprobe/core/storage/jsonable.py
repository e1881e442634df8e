"""Plain JSON from lensprobe's results and settings, and stable descriptions of objects.

- :func:`to_jsonable`: numbers, tensors, arrays, DataFrames, tuples and paths as plain JSON
  types (NaN -> null), for report data and summary files;
- :func:`stable_repr`: an object as a string that is the same in every process (no memory
  addresses), a label for people; never an identity (two objects with the same repr can differ:
  runs are identified by :mod:`lensprobe.core.storage.identity`);
- :func:`digest` and :func:`json_digest`: short content hashes (same content, same digest);
  :func:`prompt_ids_digest`: the digest of the token ids a resumable run's row was computed from;
- :func:`describe_setting`: a setting as JSON for people (what a generation trace's ``meta`` records);
- :func:`unique_keys`: the ``object_pairs_hook`` of every JSON input read, refusing a key given twice in one
  object (``json`` keeps the last one silently; TOML refuses it already).
"""

import dataclasses
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError


def to_jsonable(value: Any) -> Any:
    """Plain JSON types from numbers, tensors, arrays, DataFrames, tuples and paths (NaN -> null).

    Example:
        >>> to_jsonable({"x": torch.tensor([1.0, float("nan")]), "path": Path("a")})
        {'x': [1.0, None], 'path': 'a'}
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # DataFrame
        return to_jsonable(value.to_dict(orient="records"))
    if hasattr(value, "tolist"):  # tensors, arrays, numpy scalars
        return to_jsonable(value.tolist())
    if hasattr(value, "item"):
        return to_jsonable(value.item())
    pd = sys.modules.get("pandas")  # pd.NA and pd.NaT exist only once pandas is imported
    if pd is not None and (value is pd.NA or value is pd.NaT):
        return None
    raise LensprobeError(f"cannot write {type(value).__name__} to JSON: convert it to numbers, lists or dicts.")


def stable_repr(obj: Any) -> str:
    """``repr`` without memory addresses (so it is the same in every process); a function or
    class (not a dataclass instance) is named by its module and qualified name.

    Example:
        >>> stable_repr(lp.ablate_heads("L0H3"))
        "HeadAblation(heads='L0H3', method='zero')"
    """
    if callable(obj) and hasattr(obj, "__qualname__") and not hasattr(obj, "__dataclass_fields__"):
        text = f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"
    else:
        text = repr(obj)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def digest(*chunks: bytes | str, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``chunks`` in order (strings as UTF-8).

    Example:
        >>> digest("a", b"b") == digest("ab")
        True
    """
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk.encode() if isinstance(chunk, str) else chunk)
    return h.hexdigest()[:length]


def json_digest(data: Any, length: int = 16) -> str:
    """:func:`digest` of ``data`` as JSON with sorted keys.

    Example:
        >>> json_digest({"b": 1, "a": 2}) == json_digest({"a": 2, "b": 1})
        True
    """
    return digest(json.dumps(data, sort_keys=True), length=length)


def prompt_ids_digest(*prompts: Any) -> str:
    """The digest of the token ids a row was computed from, which every row of a resumable run records
    and a resumed run checks (one prompt: its ids; several, e.g. patching's source and target: the list).

    Each prompt is a :class:`~lensprobe.core.prompts.prompt.Prompt` (its ``tokens``), a tensor or a list of ids.

    Example:
        >>> prompt_ids_digest([1, 2, 3]) == prompt_ids_digest(torch.tensor([[1, 2, 3]]))
        True
    """
    ids = [_flat_ids(p) for p in prompts]
    return json_digest(ids[0] if len(ids) == 1 else ids)


def _flat_ids(prompt: Any) -> list:
    tokens = getattr(prompt, "tokens", prompt)
    return tokens.reshape(-1).tolist() if hasattr(tokens, "reshape") else [int(t) for t in tokens]


def describe_setting(value: Any, structured: tuple[type, ...] = ()) -> Any:
    """A JSON-able description of a setting (a thinking input, a schedule rule, a tracked set, an intervention).

    Numbers, strings and ``None`` stay as they are; a dataclass of one of the ``structured``
    types becomes ``{"type": name, field: description, ...}``; mappings and sequences are
    described item by item; a named function becomes ``"function name"``; anything else its
    :func:`stable_repr` (cut at 300 characters).

    Example:
        >>> describe_setting(lp.generation.Pause(), structured=(lp.generation.Pause,))
        {'type': 'Pause', 'token': '<thinking>'}
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, structured) and dataclasses.is_dataclass(value):
        return {"type": type(value).__name__,
                **{f.name: describe_setting(getattr(value, f.name), structured) for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        return {str(k): describe_setting(v, structured) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe_setting(v, structured) for v in value]
    if callable(value) and hasattr(value, "__name__"):
        return f"{type(value).__name__} {value.__name__}"
    text = stable_repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's ``(key, value)`` pairs as a dict, refusing a key given twice (``json.loads(text,
    object_pairs_hook=unique_keys)``): which of two values was meant is not known, so neither is taken.

    Raises:
        LensprobeError: a key appears twice in one object, named.

    Example:
        >>> json.loads('{"a": 1, "b": 2}', object_pairs_hook=unique_keys)
        {'a': 1, 'b': 2}
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise LensprobeError(f"the key {key!r} is given twice in one JSON object ({out[key]!r} and {value!r}): "
                                 "keep one")
        out[key] = value
    return out
