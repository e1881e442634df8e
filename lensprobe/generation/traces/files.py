"""The file format of generation traces: Parquet or JSON (never pickle), read back unchanged.

A :class:`~lensprobe.generation.traces.trace.GenerationTrace` saves to one file (``trace.save(path)``, which
calls :func:`write_trace`) and loads from it (``GenerationTrace.load`` and
:func:`~lensprobe.generation.traces.trace.load_trace`, through :func:`read_trace`). Both kinds carry a header
(``format``, ``version``, the layers, heads, texts, row indices, finish reasons and the generation's
meta): in Parquet the table's schema metadata, one table row per (trace row, step), the attention of a
tracked set one fixed-size list per row and step; in JSON one object, ``NaN`` written as ``null``.
Files are read through the checked reader (:mod:`lensprobe.core.storage.files`) and written atomically
(:func:`~lensprobe.core.storage.store.atomic_file`: a failed write leaves an earlier file as it was).

Example:
    >>> path = write_trace(trace, "out/trace.parquet")
    >>> lp.generation.GenerationTrace(**read_trace(path))
"""

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy
from lensprobe.core.storage.files import DATA_LIMIT, check_file, read_text
from lensprobe.core.storage.nesting import parse_json
from lensprobe.core.storage.store import atomic_file
from lensprobe.generation.traces import activations, lens

__all__ = ["FORMAT", "VERSION", "read_trace", "write_trace"]

FORMAT = "lensprobe.generation.GenerationTrace"
VERSION = 3
"""2: recorded activations (``record=``) beside the other arrays; 3: the logit lens (``lens=``). Files of
earlier versions read unchanged."""


def write_trace(trace, path: str | Path) -> Path:
    """Write ``trace`` (a :class:`~lensprobe.generation.traces.trace.GenerationTrace`) to ``path``, ``.parquet``
    or ``.json``, atomically; returns the path (see :meth:`~lensprobe.generation.traces.trace.GenerationTrace.save`)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".json"):
        raise LensprobeError(f"cannot save a trace as {path.name!r}: use a .parquet or .json file name.")
    with atomic_file(path) as tmp:
        if suffix == ".json":
            tmp.write_text(json.dumps(_json_body(trace), allow_nan=False))
        else:
            _pyarrow()[1].write_table(_arrow_table(trace), tmp)
    return path


def _header(trace) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "layers": list(trace.layers), "n_heads": trace.n_heads,
            "tracked": trace.tracked, "texts": list(trace.texts), "prompt_index": list(trace.prompt_index),
            "sample_index": list(trace.sample_index), "prompt_lengths": list(trace.prompt_lengths),
            "finish_reasons": list(trace.finish_reasons), "meta": trace.meta,
            "n_rows": trace.n_rows, "n_steps": trace.n_steps, **activations.header(trace), **lens.header(trace)}


def _json_body(trace) -> dict[str, Any]:
    body = _header(trace)
    body["token_ids"] = trace.token_ids_rows.tolist()
    body["entropy"] = _nan_to_none(trace.entropy_rows.tolist())
    body["chosen_prob"] = _nan_to_none(trace.chosen_prob_rows.tolist())
    body["thinking"] = trace.thinking_rows.tolist()
    body["str_tokens"] = trace.str_tokens_rows
    body["attention"] = {s: _nan_to_none(v.tolist()) for s, v in trace.attention_rows.items()}
    body.update(activations.json_fields(trace))
    body.update(lens.json_fields(trace))
    return body


def _arrow_table(trace):
    pa, _ = _pyarrow()
    R, T = trace.n_rows, trace.n_steps
    LH = len(trace.layers) * trace.n_heads
    cols = {
        "row": pa.array([r for r in range(R) for _ in range(T)], pa.int32()),
        "step": pa.array([t for _ in range(R) for t in range(T)], pa.int32()),
        "token_id": pa.array(trace.token_ids_rows.reshape(-1).tolist(), pa.int64()),
        "token": pa.array([trace.str_tokens_rows[r][t] if t < len(trace.str_tokens_rows[r]) else None
                           for r in range(R) for t in range(T)], pa.string()),
        "thinking": pa.array(trace.thinking_rows.reshape(-1).tolist(), pa.bool_()),
        "entropy": pa.array(trace.entropy_rows.reshape(-1).numpy(), pa.float32()),
        "chosen_prob": pa.array(trace.chosen_prob_rows.reshape(-1).numpy(), pa.float32()),
    }
    for s, v in trace.attention_rows.items():
        flat = pa.array(v.reshape(-1).numpy(), pa.float32())
        cols[f"attention:{s}"] = pa.FixedSizeListArray.from_arrays(flat, LH) if LH else pa.nulls(R * T)
    cols.update(activations.arrow_columns(trace, pa))
    cols.update(lens.arrow_columns(trace, pa))
    return pa.table(cols).replace_schema_metadata({"lensprobe": json.dumps(_header(trace))})


def read_trace(path: str | Path) -> dict[str, Any]:
    """The fields of the trace in ``path`` (written by :func:`write_trace`), for
    :class:`~lensprobe.generation.traces.trace.GenerationTrace`."""
    path = Path(path)
    if not path.exists():
        raise LensprobeError(f"trace file not found: {path}.")
    if path.suffix.lower() == ".json":
        body = parse_json(read_text(path, "trace file", DATA_LIMIT), f"trace file {path}")
        _check_header(body, path)
        head = body
        R, T = body["n_rows"], body["n_steps"]
        L, H = len(body["layers"]), body["n_heads"]
        token_ids = torch.tensor(body["token_ids"], dtype=torch.long, device="cpu").reshape(R, T)
        entropy = _tensor(body["entropy"]).reshape(R, T)
        chosen = _tensor(body["chosen_prob"]).reshape(R, T)
        thinking = torch.tensor(body["thinking"], dtype=torch.bool, device="cpu").reshape(R, T)
        attention = {s: _tensor(body["attention"][s]).reshape(R, T, L, H) for s in body["tracked"]}
        str_tokens = body["str_tokens"]
        recorded = {**activations.read_json(body), **lens.read_json(body)}
    elif path.suffix.lower() == ".parquet":
        pa, pq = _pyarrow()
        check_file(path, "trace file", DATA_LIMIT)
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(b"lensprobe")
        head = parse_json(raw, f"trace file {path}") if raw else {}
        _check_header(head, path)
        R, T = head["n_rows"], head["n_steps"]
        L, H = len(head["layers"]), head["n_heads"]
        token_ids = torch.tensor(table["token_id"].to_pylist(), dtype=torch.long, device="cpu").reshape(R, T)
        entropy = torch.tensor(table["entropy"].to_numpy(zero_copy_only=False), device="cpu").float().reshape(R, T)
        chosen = torch.tensor(table["chosen_prob"].to_numpy(zero_copy_only=False), device="cpu").float().reshape(R, T)
        thinking = torch.tensor(table["thinking"].to_pylist(), dtype=torch.bool, device="cpu").reshape(R, T)
        attention = {}
        for s in head["tracked"]:
            col = table[f"attention:{s}"].combine_chunks()
            flat = col.flatten().to_numpy(zero_copy_only=False) if L * H else []
            attention[s] = torch.tensor(flat, dtype=torch.float32, device="cpu").reshape(R, T, L, H)
        tok_col = table["token"].to_pylist()
        str_tokens = [[tok_col[r * T + t] for t in range(T) if token_ids[r, t] >= 0] for r in range(R)]
        recorded = {**activations.read_arrow(table, head), **lens.read_arrow(table, head)}
    else:
        raise LensprobeError(f"cannot read a trace from {path.name!r}: expected a .parquet or .json file.")
    return dict(token_ids_rows=token_ids, entropy_rows=entropy, chosen_prob_rows=chosen, thinking_rows=thinking,
               attention_rows=attention, str_tokens_rows=str_tokens, texts=head["texts"],
               prompt_index=head["prompt_index"], sample_index=head["sample_index"],
               prompt_lengths=head["prompt_lengths"], finish_reasons=head["finish_reasons"],
               layers=head["layers"], n_heads=head["n_heads"], meta=head["meta"], **recorded)



def _check_header(head: Mapping, path: Path) -> None:
    if head.get("format") != FORMAT:
        raise LensprobeError(f"{path} is not a lensprobe generation trace (written by GenerationTrace.save).")
    if head.get("version", 0) > VERSION:
        raise LensprobeError(f"{path} was written by a newer lensprobe (trace format {head['version']}); upgrade.")


def _pyarrow():
    try:
        pa, pq = heavy("pyarrow"), heavy("pyarrow.parquet")
    except ImportError as err:  # pragma: no cover - pyarrow is a dependency
        raise LensprobeError("Parquet needs pyarrow: `pip install pyarrow`, or save as .json.") from err
    return pa, pq


def _nan_to_none(x):
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if isinstance(x, float) and math.isnan(x) else x


def _tensor(nested) -> Tensor:
    def fix(x):
        if isinstance(x, list):
            return [fix(v) for v in x]
        return float("nan") if x is None else x
    return torch.tensor(fix(nested), dtype=torch.float32, device="cpu")
