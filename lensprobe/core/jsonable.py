"""Plain JSON types from lensprobe's results and settings (tensors, arrays, dataclasses, paths, NaN)."""

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError


def to_jsonable(value: Any) -> Any:
    """Plain JSON types from numbers, tensors, arrays, DataFrames, tuples and paths (NaN -> null)."""
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
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    raise LensprobeError(f"cannot write {type(value).__name__} to JSON: convert it to numbers, lists or dicts.")
