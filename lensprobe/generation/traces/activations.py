"""Activations recorded at every step of a generation: ``record=`` of :func:`lensprobe.generate`.

``record`` names hook points (``"blocks.3.attn.hook_z"``, any hook point of the model) or patterns
(``"blocks.*.hook_resid_post"``: ``*`` stands for one dotted part), or is a :class:`Record` (names, an
optional ``reduce`` applied inside the hook, optional prompt positions kept once), or a list of those.
Each forward of the generation writes the **newest position** of every row it runs into
``[row, step, ...]`` (float32): step 0 is the prompt forward's last position (its query predicts the
first generated token), step ``t`` the position ``prompt length - 1 + t``, the convention of every
``*_rows`` array of a trace. The hook reads the activation as it reaches the hook point (before an
intervention attached at the same hook point edits it) and keeps only ``reduce(activation)`` when a
reduction is given: nothing else of the forward is kept.

Rows are written by their index in the trace (``hook.step.rows``) at their own step (``hook.step.steps``),
so continuous batching, refill, left padding and several samples per prompt put every value where the
row alone puts it. Steps a row did not run (after it stopped) are ``NaN`` in the values and ``False`` in
:attr:`~lensprobe.generation.traces.trace.GenerationTrace.recorded_rows`, so a real non-finite value (a
step whose forward ran and produced a NaN) is told from a step that never ran.

Example:
    >>> out = lp.generate(model, prompt, max_new_tokens=32, record="blocks.*.hook_resid_post")
    >>> out.activations["blocks.3.hook_resid_post"].shape          # [step, d_model]
    >>> norms = lp.Record("blocks.*.hook_resid_post", reduce=lambda x: x.norm(dim=-1))
    >>> out = lp.generate(model, prompt, max_new_tokens=32, record=norms)
    >>> out.activations["blocks.3.hook_resid_post"].shape          # [step]
"""

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.checks import typed
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.hooks.attach import Hook
from lensprobe.core.storage.identity import identity

__all__ = ["PROMPT", "ActivationSteps", "Record", "as_records", "kept_prompt_positions", "ran_steps", "resolve_names"]

PROMPT = "prompt"
"""``Record(prompt=PROMPT)`` keeps every prompt position; any other string names a prompt segment."""


@dataclass(frozen=True)
class Record:
    """What a generation records at every step (see the module docstring).

    Args:
        names: a hook name or pattern (``*`` stands for one dotted part), or several.
        reduce: ``fn(activation) -> tensor``, applied inside the hook to the newest position's
            activation ``[batch, ...]`` (float32) and returning ``[batch, ...]``: only what it returns is
            kept (a norm, a projection onto a direction, a slice of heads). ``None``: the activation.
        prompt: also keep these prompt positions, once per row, from the prompt forward: ``"prompt"``
            (every prompt position) or the name of a prompt segment (``"filler"``; the prompts must be
            :class:`~lensprobe.Prompt` objects that have it). ``None`` (default): none.

    Example:
        >>> lp.Record("blocks.*.hook_resid_post", reduce=lambda x: x @ direction, prompt="filler")
    """

    names: str | Sequence[str]
    reduce: Callable[[Tensor], Tensor] | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else self.names
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
            raise SettingError("names", f"expected hook names or patterns (strings), got {self.names!r}: "
                               'e.g. Record("blocks.*.hook_resid_post")')
        object.__setattr__(self, "names", tuple(names))
        if self.reduce is not None and not callable(self.reduce):
            raise SettingError("reduce", f"expected a function of the activation or None, got {self.reduce!r}")
        typed("prompt", self.prompt, str | None)
        if self.prompt == "":
            raise SettingError("prompt", "expected 'prompt', a segment name or None, got ''")

    def __lensprobe_identity__(self) -> dict[str, Any]:
        return {"version": 1, "names": list(self.names), "reduce": identity(self.reduce), "prompt": self.prompt}


def as_records(record) -> list[Record]:
    """``record=`` as a list of :class:`Record` (``None``: none)."""
    if record is None:
        return []
    if isinstance(record, (str, Record)):
        record = [record]
    if not isinstance(record, (list, tuple)):
        raise LensprobeError(f"record must be a hook name or pattern, a Record, or a list of those, got "
                             f"{type(record).__name__}.")
    out = []
    for item in record:
        if isinstance(item, str):
            out.append(Record(item))
        elif isinstance(item, Record):
            out.append(item)
        else:
            raise LensprobeError(f"record: {item!r} is neither a hook name (or pattern) nor a Record.")
    return out


def _layer_key(name: str) -> tuple:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in name.split("."))


def resolve_names(model, records: list[Record]) -> list[tuple[str, Record]]:
    """Every hook name the records ask for (patterns expanded against the model's hook points, in layer
    order), with its record. Raises before any forward for a name the model lacks or one asked twice."""
    points = list(getattr(model, "hook_dict", {}))
    out: dict[str, Record] = {}
    for rec in records:
        for pattern in rec.names:
            if "*" in pattern:
                regex = re.compile(fnmatch.translate(pattern).replace(".*", r"[^.]+"))
                found = sorted((n for n in points if regex.fullmatch(n)), key=_layer_key)
            else:
                found = [pattern] if pattern in points else []
            if not found:
                close = [n for n in points if n.rsplit(".", 1)[-1] == pattern.rsplit(".", 1)[-1]][:3]
                raise LensprobeError(f"record: no hook point of this model is named {pattern!r}"
                                     f"{f' (e.g. {close})' if close else ''}: pass a name from model.hook_dict, "
                                     "or a pattern with * for one dotted part (blocks.*.hook_resid_post).")
            for name in found:
                if name in out:
                    raise LensprobeError(f"record: {name!r} is asked for twice; record each hook point once.")
                out[name] = rec
    return list(out.items())


@dataclass
class ActivationSteps:
    """The buffers and hooks of ``record=`` for one generation.

    Args:
        wanted: ``(hook name, Record)`` pairs (:func:`resolve_names`).
        n_rows, max_steps: rows of the trace and its step budget.
        prompt_positions: per row, the prompt positions kept (``None``: no record keeps prompt positions).
    """

    wanted: list[tuple[str, Record]]
    n_rows: int
    max_steps: int
    prompt_positions: dict[str, list[list[int]]] = field(default_factory=dict)
    steps: dict[str, Tensor] = field(default_factory=dict)
    prompt: dict[str, list[Tensor | None]] = field(default_factory=dict)

    def hooks(self) -> list[Hook]:
        return [(name, self._hook(name, rec)) for name, rec in self.wanted]

    def _hook(self, name: str, rec: Record):
        def record(act: Tensor, hook) -> None:
            ctx = getattr(hook, "step", None)
            if ctx is None or ctx.rows is None or ctx.steps is None:
                raise LensprobeError(f"record: {name} fired outside a generation step; record= works inside "
                                     "lp.generate only.")
            x = act.detach()
            x = x.float() if x.is_floating_point() else x.to(torch.float32)
            value = self._reduced(name, rec, x[:, -1])
            buf = self.steps.get(name)
            if buf is None:
                buf = self.steps[name] = torch.full((self.n_rows, self.max_steps, *value.shape[1:]), float("nan"),
                                                    dtype=torch.float32, device=value.device)
            elif buf.shape[2:] != value.shape[1:]:
                raise LensprobeError(f"record: {name} gave shape {tuple(value.shape[1:])} at step {ctx.step}, "
                                     f"{tuple(buf.shape[2:])} before: reduce must return the same shape each step.")
            buf[ctx.rows.to(buf.device), ctx.steps.to(buf.device)] = value
            if ctx.prefill and name in self.prompt_positions:
                self._keep_prompt(name, rec, x, ctx)

        return record

    def _reduced(self, name: str, rec: Record, x: Tensor) -> Tensor:
        value = rec.reduce(x) if rec.reduce is not None else x
        if not isinstance(value, Tensor) or value.ndim < 1 or value.shape[0] != x.shape[0]:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise LensprobeError(f"record: reduce of {name} must return a tensor of [batch, ...] (batch "
                                 f"{x.shape[0]}), got {got}: reduce each row, e.g. x.norm(dim=-1).")
        return value.detach().float()

    def _keep_prompt(self, name: str, rec: Record, x: Tensor, ctx) -> None:
        kept = self.prompt.setdefault(name, [None] * self.n_rows)
        for b, r in enumerate(ctx.rows.tolist()):
            want = torch.tensor(self.prompt_positions[name][r], dtype=torch.long, device=x.device)
            at = ctx.positions[b if ctx.positions.shape[0] > 1 else 0].to(x.device)
            columns = (at[None, :] == want[:, None]).float().argmax(-1)  # each wanted position's column
            kept[r] = self._reduced(name, rec, x[b, columns]).cpu() if want.numel() else x.new_zeros((0,))

    def results(self, ran: Tensor) -> tuple[dict[str, Tensor], dict[str, list[Tensor]]]:
        """``(name -> [row, step, ...], name -> per row [position, ...])`` on the CPU, trimmed to the trace's
        steps; ``ran`` (``[row, step]``) says which steps each row ran (the rest NaN)."""
        n_steps = ran.shape[1]
        out = {}
        for name, _ in self.wanted:
            buf = self.steps.get(name)
            if buf is None:  # no forward ran (every row refused): nothing recorded
                out[name] = torch.full((self.n_rows, n_steps), float("nan"))
                continue
            value = buf[:, :n_steps].cpu().clone()  # a plain tensor (the buffer was made in inference mode)
            value[~ran] = float("nan")
            out[name] = value
        prompt = {name: [v.clone() if v is not None else torch.zeros((0,)) for v in rows]
                  for name, rows in self.prompt.items()}
        return out, prompt


def kept_prompt_positions(records: list[tuple[str, Record]], items, rows: list[tuple[int, int]]) -> dict[str, list[list[int]]]:
    """Hook name -> per row, the prompt positions its record keeps; checked before any forward."""
    out = {}
    for name, rec in records:
        if rec.prompt is None:
            continue
        per_row = []
        for pi, _ in rows:
            ids, prompt = items[pi]
            if rec.prompt == PROMPT:
                per_row.append(list(range(len(ids))))
                continue
            segments = getattr(prompt, "segments", None)
            if not segments or rec.prompt not in segments:
                have = sorted(segments) if segments else "none: token ids carry no segments"
                raise LensprobeError(f"record {name}: prompt {pi} has no segment {rec.prompt!r} (segments: {have}); "
                                     f"pass Prompts that have it, or prompt='{PROMPT}' for every prompt position.")
            start, end = segments[rec.prompt]
            per_row.append(list(range(start, end)))
        out[name] = per_row
    return out


def ran_steps(token_ids: Tensor, finish: Sequence[str]) -> Tensor:
    """``[row, step]``: whether each row ran each step's forward (a row that stopped on non-finite
    logits ran the forward of the step it stopped at; an error row ran none)."""
    made = (token_ids >= 0).sum(-1)
    count = made + torch.tensor([f == "nonfinite" for f in finish], dtype=torch.long)
    count = torch.where(torch.tensor([f == "error" for f in finish]), 0, count)
    return torch.arange(token_ids.shape[1])[None, :] < count[:, None]


# ----- files (lensprobe.generation.traces.files) ------------------------------------------------------
def header(trace) -> dict[str, Any]:
    """The recorded values' part of a trace file's header: each name's value shape and kept positions."""
    if not trace.activations_rows and not trace.prompt_activations:
        return {}
    return {"activations": {n: list(v.shape[2:]) for n, v in trace.activations_rows.items()},
            "prompt_activations": {n: _value_shape(v) for n, v in trace.prompt_activations.items()},
            "prompt_positions": {n: [list(map(int, p)) for p in ps] for n, ps in trace.prompt_positions.items()}}


def _value_shape(rows: list[Tensor]) -> list[int]:
    return next((list(v.shape[1:]) for v in rows if v.ndim >= 1 and v.shape[0]), [])


def json_fields(trace) -> dict[str, Any]:
    """The recorded values as JSON lists (``NaN`` as ``None``)."""
    if not trace.activations_rows and not trace.prompt_activations:
        return {}
    return {"activation_values": {n: _nan_to_none(v.tolist()) for n, v in trace.activations_rows.items()},
            "prompt_activation_values": {n: [_nan_to_none(v.tolist()) for v in rows]
                                         for n, rows in trace.prompt_activations.items()}}


def arrow_columns(trace, pa) -> dict[str, Any]:
    """Parquet columns: ``activation:<name>`` one fixed-size list per (row, step); ``prompt:<name>`` the
    row's kept prompt values at step 0 (null at the other steps)."""
    R, T = trace.n_rows, trace.n_steps
    cols = {}
    for name, v in trace.activations_rows.items():
        width = int(torch.tensor(v.shape[2:]).prod()) if v.ndim > 2 else 1
        flat = pa.array(v.reshape(-1).numpy(), pa.float32())
        cols[f"activation:{name}"] = pa.FixedSizeListArray.from_arrays(flat, width) if width else pa.nulls(R * T)
    for name, rows in trace.prompt_activations.items():
        cells = [rows[r].reshape(-1).tolist() if t == 0 else None for r in range(R) for t in range(T)]
        cols[f"prompt:{name}"] = pa.array(cells, pa.list_(pa.float32()))
    return cols


def read_json(body: dict) -> dict[str, Any]:
    """The recorded values of a JSON trace file (see :func:`json_fields`)."""
    head = body.get("activations")
    if head is None:
        return {}
    R, T = body["n_rows"], body["n_steps"]
    steps = {n: _tensor(body["activation_values"][n]).reshape(R, T, *shape) for n, shape in head.items()}
    prompt = {n: [_tensor(v).reshape(-1, *shape) for v in body["prompt_activation_values"][n]]
              for n, shape in body["prompt_activations"].items()}
    return {"activations_rows": steps, "prompt_activations": prompt, "prompt_positions": body["prompt_positions"]}


def read_arrow(table, head: dict) -> dict[str, Any]:
    """The recorded values of a Parquet trace file (see :func:`arrow_columns`)."""
    if "activations" not in head:
        return {}
    R, T = head["n_rows"], head["n_steps"]
    steps = {}
    for name, shape in head["activations"].items():
        col = table[f"activation:{name}"].combine_chunks()
        flat = col.flatten().to_numpy(zero_copy_only=False) if shape and all(shape) or not shape else []
        steps[name] = torch.tensor(flat, dtype=torch.float32).reshape(R, T, *shape)
    prompt = {}
    for name, shape in head["prompt_activations"].items():
        cells = table[f"prompt:{name}"].to_pylist()
        prompt[name] = [torch.tensor(cells[r * T], dtype=torch.float32).reshape(-1, *shape) for r in range(R)]
    return {"activations_rows": steps, "prompt_activations": prompt, "prompt_positions": head["prompt_positions"]}


def _nan_to_none(x):
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def _tensor(nested) -> Tensor:
    def fix(x):
        if isinstance(x, list):
            return [fix(v) for v in x]
        return float("nan") if x is None else x
    return torch.tensor(fix(nested), dtype=torch.float32)
