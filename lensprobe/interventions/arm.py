r"""ARM, the activation redistribution module of the meaningless-tokens paper (arXiv 2510.01032).

The paper explains the gain from filler tokens by a redistribution of layer-0 MLP
activations away from zero, and reproduces it without filler by editing those activations
directly. ARM works on ``a = act_fn(gate_proj(x))``, the gated MLP's activation before it is
multiplied by ``up_proj(x)``, so the MLP computes ``down_proj(ARM(a) * up_proj(x))``.

The rule (the authors' released code, ``variant="default"``), on the whole tensor passed in:

1. ``eps = 1.4826 * MAD(|a|) * c``, where ``MAD = median(| |a| - median(|a|) |)`` (clamped at
   ``1e-12``); medians are ``torch.median``'s (the lower middle value for an even count).
2. ``fraction = clamp(k * mean(|a| < eps), p_min, p_max)``; ``n = max(1, round(fraction * a.numel()))``
   (Python's ``round``: halves go to the even integer).
3. The ``n`` entries with the smallest ``|a|`` (``torch.topk(largest=False)`` on the flattened
   ``|a|``, so ties are broken as topk breaks them) move to ``sign * u * target`` with
   ``u ~ U(0, 1)``: one ``torch.rand`` draw per moved entry, in topk's order (smallest
   ``|a|`` first). ``sign`` is the entry's sign, 0 counting as positive. ``target`` is the
   ``percentile``-th percentile of all entries of ``a`` (linear interpolation, as
   ``numpy.percentile``) for positive entries, and ``|min a|`` over the negative entries
   for negative ones (0 when there are none).
4. Every other entry is returned unchanged, bit for bit.

``mode="add"`` adds the shift to the original value instead (``a + sign * u * target``): the
paper's text says the values are "added", its code replaces them; the default follows the
code.

``variant="gemma"`` is the authors' Gemma-3 rule: ``fraction = c`` directly (``p_min``,
``p_max`` and ``k`` are unused); the entries with ``|a| <= quantile(|a|, c)`` move (a
threshold, so ties at the threshold all move); ``target`` for positive entries is
``quantile(|a|, percentile)`` of the *absolute* values with ``percentile`` in ``[0, 1]``
(a value above 1 is divided by 100); one ``u`` is drawn for every entry of the tensor (its
shape), and the moved entries use theirs.

Consequences worth knowing:

- ``p_min = p_max = 0`` still moves exactly one entry (the ``max(1, ...)`` rule).
- :func:`arm_redistribute` computes its statistics over the whole tensor it is given, as the
  authors' code does on a batch of one. :class:`ARM` gives it one batch row at a time by
  default (``per_row=True``, padding left out), which is the authors' one-problem-at-a-time
  semantics, batched; ``per_row=False`` passes the whole batch (a row's result then depends
  on its neighbours). Under a KV cache, a decode step's tensor is one position, so the
  statistics of each step are those of that single position (the prompt forward sees all
  prompt positions at once).
- Statistics are computed in float32; the result has the input's dtype. The input is never
  modified.
- Without ``generator`` (or ``seed``) the draws come from torch's global generator, as in
  the authors' code, so two runs differ.
"""

import math
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks import Hook, current_step
from lensprobe.core.lazy import heavy
from lensprobe.interventions.arm_presets import ARM_PRESETS, Source, arm_preset

__all__ = ["ARM", "ARM_PRESETS", "MAD_SCALE", "BatchDependenceWarning", "activation_function", "arm_redistribute", "near_zero_band"]

Mode = Literal["replace", "add"]
Variant = Literal["default", "gemma"]
_MODES = ("replace", "add")
_VARIANTS = ("default", "gemma")
MAD_SCALE = 1.4826
"""Scale that makes the median absolute deviation a standard deviation for normal data."""


# --------------------------------------------------------------------------- the rule


def arm_redistribute(activations: Float[Tensor, "..."], *, c: float, percentile: float,
                     p_min: float = 0.02, p_max: float = 0.25, k: float = 1, mode: Mode = "replace",
                     variant: Variant = "default",
                     generator: torch.Generator | None = None) -> Float[Tensor, "..."]:
    r"""Move the near-zero entries of ``activations`` away from zero (the paper's ARM rule).

    See the module docstring for the rule step by step. Statistics are over the whole
    tensor (every batch row and position together).

    Args:
        activations: ``act_fn(gate_proj(x))`` of a gated MLP, any shape (usually
            ``[batch, pos, d_mlp]``). Not modified.
        c: scale of the near-zero band ``eps = 1.4826 * MAD(|a|) * c`` (``variant="gemma"``:
            the fraction of entries to move, in ``[0, 1]``).
        percentile: percentile of ``a`` (0-100) that bounds the new positive values
            (``variant="gemma"``: quantile of ``|a|`` in ``[0, 1]``; above 1 it is divided by 100).
        p_min, p_max: bounds of the moved fraction (at least one entry always moves).
        k: multiplier of the near-zero share before clamping.
        mode: ``"replace"`` (the authors' code) or ``"add"`` (the paper's text).
        variant: ``"default"`` or ``"gemma"`` (the authors' Gemma-3 rule).
        generator: source of the uniform draws (``None``: torch's global generator). It must
            live on the activations' device.

    Returns:
        A new tensor of the input's shape and dtype.

    Raises:
        LensprobeError: a bad argument or an empty tensor.

    Example:
        >>> a = torch.tensor([[-0.3, 0.001, 2.0, -0.002, 0.5, 1.2, 0.0004, -1.0]])
        >>> out = arm_redistribute(a, c=0.1, percentile=95, generator=torch.Generator().manual_seed(0))
        >>> int((out != a).sum())  # round(0.25 * 8) = 2 entries moved
        2
    """
    _check_rule(c, percentile, p_min, p_max, k, mode, variant)
    if not isinstance(activations, Tensor) or not activations.is_floating_point():
        raise LensprobeError(
            f"activations must be a floating-point tensor, got {type(activations).__name__}"
            f"{'' if not isinstance(activations, Tensor) else ' of dtype ' + str(activations.dtype)}."
        )
    if activations.numel() == 0:
        raise LensprobeError("activations is empty: ARM needs at least one entry.")
    if generator is not None and generator.device != activations.device and not (
            generator.device.type == activations.device.type == "cpu"):
        raise LensprobeError(
            f"the generator is on {generator.device} but the activations are on "
            f"{activations.device}: create it with torch.Generator(device=activations.device)."
        )
    if variant == "gemma":
        return _redistribute_gemma(activations, c, percentile, mode, generator)
    return _redistribute_default(activations, c, percentile, p_min, p_max, k, mode, generator)


def near_zero_band(flat: Float[Tensor, " n"], c: float) -> Tensor:
    """ARM's near-zero band ``eps = 1.4826 * MAD(|a|) * c`` of a flat float32 tensor (a 0-d tensor).

    ``MAD = median(| |a| - median(|a|) |)``, clamped at ``1e-12``; ``torch.median`` takes the
    lower middle value for an even count.
    """
    magnitude = flat.abs()
    mad = (magnitude - magnitude.median()).abs().median().clamp_min(1e-12)
    return MAD_SCALE * mad * c


def _redistribute_default(a: Tensor, c: float, percentile: float, p_min: float, p_max: float,
                          k: float, mode: str, generator) -> Tensor:
    flat = a.detach().reshape(-1).to(torch.float32)
    magnitude = flat.abs()
    eps = near_zero_band(flat, c)
    near_zero = (magnitude < eps).to(torch.float32).mean()
    fraction = float(torch.clamp(k * near_zero, min=p_min, max=p_max))
    total = flat.numel()
    n = min(total, max(1, int(round(fraction * total))))
    _, idx = torch.topk(magnitude, n, largest=False)
    pos_target = _quantile(flat, percentile / 100.0)
    negative = flat[flat < 0]
    neg_target = negative.min().abs() if negative.numel() else flat.new_zeros(())
    chosen = flat[idx]
    signs = torch.where(chosen < 0, -1.0, 1.0).to(torch.float32)
    u = torch.rand(n, generator=generator, device=flat.device, dtype=torch.float32)
    shift = signs * u * torch.where(signs > 0, pos_target, neg_target)
    new = shift if mode == "replace" else chosen + shift
    out = a.detach().reshape(-1).clone()
    out[idx] = new.to(a.dtype)
    return out.view_as(a)


def _redistribute_gemma(a: Tensor, c: float, percentile: float, mode: str, generator) -> Tensor:
    flat = a.detach().reshape(-1).to(torch.float32)
    magnitude = flat.abs()
    tau = _quantile(magnitude, min(max(float(c), 0.0), 1.0))
    mask = magnitude <= tau
    q = percentile / 100.0 if percentile > 1 else percentile
    pos_target = _quantile(magnitude, q)
    negative = flat[flat < 0]
    neg_target = negative.min().abs() if negative.numel() else flat.new_zeros(())
    signs = torch.where(flat < 0, -1.0, 1.0).to(torch.float32)
    u = torch.rand(tuple(a.shape), generator=generator, device=flat.device, dtype=torch.float32).reshape(-1)
    shift = signs * u * torch.where(signs > 0, pos_target, neg_target)
    new = shift if mode == "replace" else flat + shift
    out = torch.where(mask, new.to(a.dtype), a.detach().reshape(-1))
    return out.view_as(a)


def _quantile(values: Tensor, q: float) -> Tensor:
    """``q``-quantile of a 1-D tensor with linear interpolation (``numpy.percentile``'s
    default), by selection, so it works on tensors of any size (``torch.quantile`` refuses
    more than 16 million entries)."""
    n = values.numel()
    position = q * (n - 1)
    lo = int(math.floor(position))
    hi = min(lo + 1, n - 1)
    low = values.kthvalue(lo + 1).values
    if hi == lo or position == lo:
        return low
    high = values.kthvalue(hi + 1).values
    return low + (high - low) * (position - lo)


def _check_rule(c, percentile, p_min, p_max, k, mode, variant) -> None:
    if variant not in _VARIANTS:
        raise LensprobeError(f"variant must be one of {_VARIANTS}, got {variant!r}.")
    if mode not in _MODES:
        raise LensprobeError(f"mode must be 'replace' (the authors' code) or 'add' (the paper's text), got {mode!r}.")
    if not _is_real(c) or c < 0:
        raise LensprobeError(f"c must be a non-negative number, got {c!r} (the presets use 0.05-0.32).")
    if variant == "gemma" and c > 1:
        raise LensprobeError(
            f"with variant='gemma', c is the fraction of entries to move and must be in [0, 1], got {c!r}."
        )
    if not _is_real(percentile):
        raise LensprobeError(f"percentile must be a number, got {percentile!r}.")
    if not 0 <= percentile <= 100:
        raise LensprobeError(
            f"percentile must be in [0, 100] (e.g. 99.5), got {percentile!r}." if variant == "default" else
            f"with variant='gemma', percentile is a quantile in [0, 1] (or a percent in (1, 100]), got {percentile!r}."
        )
    for name, value in (("p_min", p_min), ("p_max", p_max)):
        if not _is_real(value) or not 0 <= value <= 1:
            raise LensprobeError(f"{name} must be a fraction in [0, 1], got {value!r}.")
    if p_min > p_max:
        raise LensprobeError(f"p_min ({p_min!r}) must not exceed p_max ({p_max!r}): swap them.")
    if not _is_real(k) or k < 0:
        raise LensprobeError(f"k must be a non-negative number, got {k!r} (the authors use 1).")


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------- the intervention


class _GateUp:
    """The gate pre-activation and up projection of one forward, recorded for ``hook_post``."""
    __slots__ = ("gate", "up")

    def __init__(self) -> None:
        self.gate: Tensor | None = None
        self.up: Tensor | None = None

    def record_gate(self, gate: Tensor, hook) -> None:
        self.gate = gate

    def record_up(self, up: Tensor, hook) -> None:
        self.up = up


class BatchDependenceWarning(UserWarning):
    """An intervention computed statistics over several rows of one forward (ARM with ``per_row=False``)."""


class _Draws:
    """Generators for one attachment: one shared, or one per batch row (``per_row``), each
    seeded with ``seed`` on first use on the activations' device."""
    __slots__ = ("seed", "shared", "rows", "warned")

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.warned = False
        self.shared: torch.Generator | None = None
        self.rows: dict[int, torch.Generator] = {}

    def _new(self, device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)

    def warn_batch(self, layer: int, rows: int) -> None:
        """Warn (once per attachment) that whole-batch statistics mix ``rows`` rows."""
        if self.warned:
            return
        self.warned = True
        warnings.warn(
            f"ARM at layer {layer} with per_row=False computes its statistics over a forward of {rows} rows, "
            "so each row's result depends on the others (and on the batch schedule); use per_row=True (the "
            "default: the authors' one-problem-at-a-time statistics, batched) unless this is what you want.",
            BatchDependenceWarning, stacklevel=3,
        )

    def get(self, device, row: int | None = None, restart: bool = False) -> torch.Generator | None:
        """The generator for ``row`` (``None``: the shared one); ``restart`` seeds the row's anew."""
        if self.seed is None:
            return None
        if row is None:
            if self.shared is None:
                self.shared = self._new(device)
            return self.shared
        if row not in self.rows or restart:
            self.rows[row] = self._new(device)
        return self.rows[row]


@dataclass(frozen=True)
class _ARMHook:
    """At ``hook_post``: returns ``arm_redistribute(act_fn(gate)) * up``."""
    arm: "ARM"
    act_fn: Any
    store: _GateUp
    draws: _Draws = field(repr=False)

    def __call__(self, post: Tensor, hook) -> Tensor:
        gate, up = self.store.gate, self.store.up
        self.store.gate = self.store.up = None
        if gate is None or up is None or gate.shape != post.shape or up.shape != post.shape:
            raise LensprobeError(
                f"ARM at layer {self.arm.layer}: the gate and up projections were not recorded before "
                "the MLP's hook_post in this forward; ARM needs a gated MLP whose hook_pre and "
                "hook_pre_linear fire before hook_post."
            )
        act = self.act_fn(gate)
        if not torch.allclose(act * up, post, rtol=1e-3, atol=1e-5):
            raise LensprobeError(
                f"ARM at layer {self.arm.layer}: act_fn(hook_pre) * hook_pre_linear does not equal "
                "hook_post on this model, so the MLP's hooks do not hold gate_proj(x), up_proj(x) and "
                "their gated product (or another hook edited one of them first); ARM cannot rebuild "
                "act_fn(gate_proj(x)) here."
            )
        if self.arm.per_row and act.dim() >= 2:
            return self._per_row(act) * up
        if act.dim() >= 1 and act.shape[0] > 1:
            self.draws.warn_batch(self.arm.layer, act.shape[0])
        return arm_redistribute(act, generator=self.draws.get(act.device), **self.arm.rule()) * up

    def _per_row(self, act: Tensor) -> Tensor:
        """Each batch row edited by its own statistics over its own positions (padding left out).

        Inside :func:`lensprobe.generate`, batch row ``b`` is generation row ``info.rows[b]``:
        its generator is that row's, restarted at the row's prompt forward, so the row draws
        what it draws alone whatever shares its forward."""
        info = current_step()
        batch = act.shape[0]
        if info is not None and not info.fits(batch, act.shape[1]):
            raise LensprobeError(
                f"ARM at layer {self.arm.layer}: this forward's MLP input has {batch} row(s) x {act.shape[1]} "
                f"position(s) but the generation step describes {tuple(info.positions.shape)}; per-row "
                "statistics cannot tell the rows' positions apart."
            )
        inside = info is not None and info.rows is not None and len(info.rows) == batch
        keys = info.rows.tolist() if inside else list(range(batch))
        restart = inside and info.prefill
        out = act.clone()
        for b, key in enumerate(keys):
            gen = self.draws.get(act.device, key, restart)
            if info is None:
                out[b] = arm_redistribute(act[b], generator=gen, **self.arm.rule())
                continue
            real = (info.positions[b if info.positions.shape[0] > 1 else 0] >= 0).to(act.device)
            if bool(real.all()):
                out[b] = arm_redistribute(act[b], generator=gen, **self.arm.rule())
            elif bool(real.any()):  # a left-padded row of a static batch: its prompt positions only
                out[b, real] = arm_redistribute(act[b, real], generator=gen, **self.arm.rule())
        return out


@dataclass(frozen=True)
class ARM:
    r"""Intervention: the paper's activation redistribution module on one layer's gated MLP.

    The MLP of ``layer`` computes ``down_proj(arm_redistribute(act_fn(gate_proj(x))) * up_proj(x))``
    (see :func:`arm_redistribute` for the rule). TransformerLens has no hook on
    ``act_fn(gate_proj(x))`` itself, so ARM records ``blocks.{layer}.mlp.hook_pre``
    (``gate_proj(x)``) and ``hook_pre_linear`` (``up_proj(x)``), recomputes the activation
    with the model's own activation function, and returns the edited product at
    ``hook_post`` (the input of ``down_proj``). Entries ARM does not move give exactly the
    unedited product.

    The statistics are per batch row by default (``per_row=True``): each row's over its own
    positions of one forward, padding left out. The authors run one problem at a time, so
    their statistics (over the whole tensor of a batch of one) are exactly one row's: this is
    their semantics, batched, and a row gets the same result in any batch, under continuous
    batching, in any refill order. In a KV-cached generation the prompt forward sees all
    prompt positions and each decode step sees one position per row, so later steps are
    edited by the statistics of a single position. ``p_min = p_max = 0`` still moves one
    entry per forward (per row).

    Args:
        layer: 0-based layer (the authors edit layer 0 only).
        c, percentile, p_min, p_max, k, mode, variant: the rule's settings, see
            :func:`arm_redistribute`; :meth:`preset` gives the authors' values per model.
        seed: ``None`` draws from torch's global generator (the authors' code: two runs
            differ). An int seeds a ``torch.Generator`` on the activations' device. The
            generator is created when ``hooks(model)`` is called (once per
            ``lp.intervene`` block or ``lp.generate`` call) and advances through the
            forwards of that attachment, so the same seed gives the same draws and each
            generation with a fresh attachment is reproducible.
        per_row: ``True`` (default): statistics per batch row (first dimension), over that
            row's positions only (left padding of a static batch left out, as
            ``lp.current_step().positions`` marks it), so a row's result never depends on the
            other rows. With a seed, each row draws from its own generator seeded with
            ``seed`` (identical rows get identical draws); inside :func:`lensprobe.generate` a
            row's generator follows the generation's row (``lp.current_step().rows``) and
            restarts at the row's prompt forward (``prefill``), so with a seed each
            (prompt, sample) row draws exactly what it draws alone under any ``batch_size``,
            refill order and engine. ``False``: the authors' code literally, statistics over
            the whole tensor (batch rows and padding included); the intervention is then
            ``batch_dependent`` (:func:`lensprobe.generate` runs static batches, evaluations run
            each problem alone) and it warns once (:class:`BatchDependenceWarning`) when a
            forward holds more than one row.

    Raises:
        LensprobeError: a bad setting (at construction); a layer out of range, a model
            without a gated MLP or without the needed hooks (when attached).

    Example:
        >>> arm = ARM(layer=0, c=0.1, percentile=95, seed=0)
        >>> with lp.intervene(model, arm):
        ...     logits = model(tokens)
        >>> out = lp.generate(model, prompt, max_new_tokens=64,
        ...                   interventions=[ARM.preset("Qwen/Qwen2.5-Math-7B", seed=0)])
    """

    layer: int = 0
    c: float | None = None
    percentile: float | None = None
    p_min: float = 0.02
    p_max: float = 0.25
    k: float = 1
    mode: Mode = "replace"
    variant: Variant = "default"
    seed: int | None = None
    per_row: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.layer, int) or isinstance(self.layer, bool) or self.layer < 0:
            raise LensprobeError(f"layer must be a non-negative int (0-based), got {self.layer!r}.")
        if self.c is None or self.percentile is None:
            missing = " and ".join(n for n in ("c", "percentile") if getattr(self, n) is None)
            raise LensprobeError(
                f"ARM needs {missing}: pass lp.ARM(c=..., percentile=...) or use "
                "lp.ARM.preset(model_name) for the authors' values."
            )
        _check_rule(self.c, self.percentile, self.p_min, self.p_max, self.k, self.mode, self.variant)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise LensprobeError(f"seed must be an int or None, got {self.seed!r}.")
        if not isinstance(self.per_row, bool):
            raise LensprobeError(f"per_row must be True or False, got {self.per_row!r}.")

    @classmethod
    def preset(cls, model_name: Any, benchmark: str = "math500", *, source: Source = "code",
               **overrides) -> "ARM":
        """The authors' settings for ``model_name`` on ``benchmark`` (the one ARM preset function).

        The values and their sources (Table 9 of the paper, or the released code) are in
        :mod:`lensprobe.interventions.arm_presets`; :func:`~lensprobe.interventions.arm_presets.arm_preset`
        tells where each value comes from.

        Args:
            model_name: a model name, with or without organisation (``"Qwen/Qwen2.5-Math-7B"``,
                ``"qwen2.5-math-7b"``), or a loaded model (its ``cfg.model_name``).
            benchmark: ``"math500"``, ``"aime2024"``, ``"aime2025"``, ``"gpqa"``, ``"humaneval"``
                or ``"livecodebench"`` (case and ``-``/``_`` ignored).
            source: ``"code"`` (default: the released code where it has a value, else Table 9) or
                ``"paper"`` (Table 9 and the paper's text); they differ in a few cells.
            **overrides: other :class:`ARM` fields (``layer``, ``seed``, ``per_row``, ...).

        Raises:
            LensprobeError: an unknown benchmark or model, or a cell where the authors report no
                ARM gain ("-" in Table 9).

        Example:
            >>> ARM.preset("Qwen/Qwen2.5-Math-7B").c
            0.1
            >>> ARM.preset("google/gemma-3-27b-it", "aime2024", source="paper").percentile
            0.85
        """
        settings = arm_preset(model_name, benchmark, source).settings
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise LensprobeError(f"unknown ARM field(s) {sorted(unknown)}: use {[f.name for f in fields(cls)]}.")
        return cls(**{**settings, **overrides})

    @property
    def batch_dependent(self) -> bool:
        """Whether a row's result depends on the other rows of its forward (``per_row=False``)."""
        return not self.per_row

    def with_default_seed(self, seed: int) -> "ARM":
        """This ARM drawing from ``seed`` when it has no seed of its own (else itself)."""
        return self if self.seed is not None else replace(self, seed=seed)

    def rule(self) -> dict[str, Any]:
        """The rule's settings as :func:`arm_redistribute` keywords."""
        return dict(c=self.c, percentile=self.percentile, p_min=self.p_min, p_max=self.p_max, k=self.k,
                    mode=self.mode, variant=self.variant)

    def hooks(self, model) -> list[Hook]:
        n_layers = int(model.cfg.n_layers)
        if self.layer >= n_layers:
            raise LensprobeError(
                f"layer {self.layer} out of range: model has {n_layers} layers (0-{n_layers - 1})."
            )
        prefix = f"blocks.{self.layer}.mlp"
        names = [f"{prefix}.hook_pre", f"{prefix}.hook_pre_linear", f"{prefix}.hook_post"]
        hook_dict = getattr(model, "hook_dict", {})
        missing = [n for n in names if n not in hook_dict]
        if not getattr(model.cfg, "gated_mlp", False) or missing:
            raise LensprobeError(
                f"ARM needs a gated MLP (down_proj(act_fn(gate_proj(x)) * up_proj(x)), as in Llama, "
                f"Qwen2 or Gemma-3) with hooks {names}; this model "
                + ("has no gated MLP" if not getattr(model.cfg, "gated_mlp", False) else f"lacks {missing}")
                + "."
            )
        store = _GateUp()
        hook = _ARMHook(self, activation_function(model, self.layer), store, _Draws(self.seed))
        return [(names[0], store.record_gate), (names[1], store.record_up), (names[2], hook)]


def activation_function(model, layer: int):
    """The MLP's activation function: the Hugging Face module's ``act_fn`` when the model
    wraps one, else ``transformers``' function named by ``model.cfg.act_fn``.

    Raises:
        LensprobeError: neither is found.

    Example:
        >>> act = activation_function(model, 0)   # e.g. SiLU on Llama and Qwen2
        >>> a = act(gate)                          # gate = blocks.0.mlp.hook_pre
    """
    try:
        mlp = model.blocks[layer].mlp
    except (AttributeError, IndexError, TypeError):
        mlp = None
    for owner in (getattr(mlp, "original_component", None), mlp):
        fn = getattr(owner, "act_fn", None)
        if callable(fn):
            return fn
    name = getattr(model.cfg, "act_fn", None)
    if name:
        table = heavy("transformers.activations").ACT2FN
        if name in table:
            return table[name]
    raise LensprobeError(
        f"cannot find the activation function of layer {layer}'s MLP (no act_fn on the module and "
        f"model.cfg.act_fn={name!r} is not a known activation)."
    )
