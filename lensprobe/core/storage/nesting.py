"""Parsing the JSON and TOML lensprobe is given, refusing data nested deeper than :data:`MAX_NESTING`.

A file of ``[[[[...]]]]`` nested a hundred thousand deep makes Python's parsers (and any code that
walks the data afterwards) exceed the recursion limit; no settings file, result row, recipe or
problem file of lensprobe nests more than a few levels. :func:`parse_json` and :func:`parse_toml`
parse the text and refuse deeper data in one line naming the file, checked without recursion.

Example:
    >>> parse_json('{"kind": "eval"}', "settings file runs/x/config.json")
    {'kind': 'eval'}
    >>> parse_json("[" * 100_000 + "]" * 100_000, "problem file p.json")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: problem file p.json nests data deeper than 64 levels: ...
"""

import json
from typing import Any

import tomllib

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.jsonable import unique_keys

MAX_NESTING = 64
"""Deepest nesting of lists and objects (tables) read from a JSON or TOML text."""


def parse_json(text: str | bytes, what: str) -> Any:
    """``json.loads(text)``, refusing data nested deeper than :data:`MAX_NESTING` (``what`` names the text) and
    an object that gives one key twice (:func:`~lensprobe.core.storage.jsonable.unique_keys`).

    Raises:
        LensprobeError: the data nests too deep, or gives a key twice.
        json.JSONDecodeError: the text is not JSON (callers say how to fix their file).
    """
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except RecursionError:
        raise _too_deep(what) from None
    return check_nesting(data, what)


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """``tomllib.loads(text)``, refusing data nested deeper than :data:`MAX_NESTING`.

    Raises:
        LensprobeError: the data nests too deep.
        tomllib.TOMLDecodeError: the text is not TOML.
    """
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(what) from None
    return check_nesting(data, what)


def check_nesting(data: Any, what: str) -> Any:
    """``data``, if its lists and dicts nest at most :data:`MAX_NESTING` deep (walked without recursion)."""
    todo = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list)):
            if depth >= MAX_NESTING:
                raise _too_deep(what)
            todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return data


def _too_deep(what: str) -> LensprobeError:
    return LensprobeError(f"{what} nests data deeper than {MAX_NESTING} levels: lensprobe reads no such file; "
                          "check that it is the file meant (flatten the data).")
