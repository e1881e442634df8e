r"""ARM, the activation redistribution module of the meaningless-tokens paper (arXiv 2510.01032),
as an intervention.

The paper explains the gain from filler tokens by a redistribution of layer-0 MLP
activations away from zero, and reproduces it without filler by editing those activations
directly. ARM works on ``a = act_fn(gate_proj(x))``, the gated MLP's activation before it is
multiplied by ``up_proj(x)``, so the MLP computes ``down_proj(ARM(a) * up_proj(x))``. The rule
itself, step by step, is :func:`~lensprobe.interventions.arm_rule.arm_redistribute`
(:mod:`lensprobe.interventions.arm_rule`); the authors' settings per model and benchmark are
:mod:`lensprobe.interventions.arm_presets`.

:class:`ARM` gives the rule one batch row at a time by default (``per_row=True``, padding left
out): the authors' one-problem-at-a-time semantics, batched. ``per_row=False`` passes the whole
batch, as the authors' code does on a batch of one; a row's result then depends on its
neighbours, and the intervention declares itself ``batch_dependent``.
"""

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from lensprobe.core.checks import check_annotated
from lensprobe.core.errors import LensprobeError, LensprobeWarning
from lensprobe.core.hooks.attach import Capabilities, Hook
from lensprobe.core.lazy import heavy
from lensprobe.interventions.arm_presets import ARM_PRESETS, NoPresetError, Source, arm_preset
from lensprobe.interventions.arm_rule import (
    MAD_SCALE,
    Mode,
    Variant,
    arm_redistribute,
    arm_redistribute_rows,
    check_rule,
    near_zero_band,
)

__all__ = ["ARM", "ARM_PRESETS", "MAD_SCALE", "BatchDependenceWarning", "activation_function", "arm_redistribute", "near_zero_band"]

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


class BatchDependenceWarning(LensprobeWarning):
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

    @staticmethod
    def _new(device, seed: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed)

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
        seed = self.seed
        if seed is None:
            return None
        if row is None:
            if self.shared is None:
                self.shared = self._new(device, seed)
            return self.shared
        if row not in self.rows or restart:
            self.rows[row] = self._new(device, seed)
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
            return self._per_row(act, hook) * up
        if act.dim() >= 1 and act.shape[0] > 1:
            self.draws.warn_batch(self.arm.layer, act.shape[0])
        return arm_redistribute(act, generator=self.draws.get(act.device), **self.arm.rule()) * up

    def _per_row(self, act: Tensor, hook) -> Tensor:
        """Each batch row edited by its own statistics over its own positions (padding left out).

        Inside :func:`lensprobe.generate`, batch row ``b`` is generation row ``info.rows[b]``:
        its generator is that row's, restarted at the row's prompt forward, so the row draws
        what it draws alone whatever shares its forward."""
        info = getattr(hook, "step", None)  # a bare TransformerLens hook point has none
        batch = act.shape[0]
        if info is not None and not info.fits(batch, act.shape[1]):
            raise LensprobeError(
                f"ARM at layer {self.arm.layer}: this forward's MLP input has {batch} row(s) x {act.shape[1]} "
                f"position(s) but the generation step describes {tuple(info.positions.shape)}; per-row "
                "statistics cannot tell the rows' positions apart."
            )
        rows = info.rows if info is not None and info.rows is not None and len(info.rows) == batch else None
        keys = rows.tolist() if rows is not None else list(range(batch))
        restart = rows is not None and info is not None and info.prefill
        gens = [self.draws.get(act.device, key, restart) for key in keys]
        whole = info is None or bool((info.positions >= 0).all())
        if whole and self.arm.variant == "default":  # every row's statistics at once
            rule = {k: v for k, v in self.arm.rule().items() if k != "variant"}
            return arm_redistribute_rows(act.reshape(batch, -1), gens, **rule).view_as(act)
        out = act.clone()
        for b, gen in enumerate(gens):
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
            ``hook.step.positions`` marks it), so a row's result never depends on the
            other rows. With a seed, each row draws from its own generator seeded with
            ``seed`` (identical rows get identical draws); inside :func:`lensprobe.generate` a
            row's generator follows the generation's row (``hook.step.rows``) and
            restarts at the row's prompt forward (``prefill``), so with a seed each
            (prompt, sample) row draws exactly what it draws alone under any ``batch_size``,
            refill order and engine. ``False``: the authors' code literally, statistics over
            the whole tensor (batch rows and padding included); the intervention is then
            ``batch_dependent`` (:func:`lensprobe.generate` runs static batches, evaluations run
            each problem alone) and it warns once (:class:`BatchDependenceWarning`) when a
            forward holds more than one row.
        source: where the settings come from, a label recorded beside the run's settings and never
            part of ARM's identity or equality (two ARMs of equal numbers run the same):
            ``"code"`` or ``"paper"`` from :meth:`preset` (``"code (layer defaults)"`` with
            ``layer_defaults=True``), ``None`` for settings given by hand. Settings given on top of
            a preset keep its source.

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
    source: str | None = field(default=None, compare=False, metadata={"identity": False, "cmd": False})

    def __post_init__(self) -> None:
        check_annotated(self)  # every field by its type ("true" is no per_row, True no c), then the rule
        if self.layer < 0:
            raise LensprobeError(f"layer must be a non-negative int (0-based), got {self.layer!r}.")
        if self.c is None or self.percentile is None:
            missing = " and ".join(n for n in ("c", "percentile") if getattr(self, n) is None)
            raise LensprobeError(
                f"ARM needs {missing}: pass lp.ARM(c=..., percentile=...) or use "
                "lp.ARM.preset(model_name) for the authors' values."
            )
        check_rule(self.c, self.percentile, self.p_min, self.p_max, self.k, self.mode, self.variant)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise LensprobeError(f"seed must be an int or None, got {self.seed!r}.")
        if not isinstance(self.per_row, bool):
            raise LensprobeError(f"per_row must be True or False, got {self.per_row!r}.")

    @classmethod
    def preset(cls, model_name: Any, benchmark: str | None = "math500", *, source: Source = "code",
               layer_defaults: bool = False, fallback: Mapping[str, Any] | None = None, **overrides) -> "ARM":
        """The authors' settings for ``model_name`` on ``benchmark`` (the one ARM preset function).

        The values and their sources (Table 9 of the paper, or the released code) are in
        :mod:`lensprobe.interventions.arm_presets`; :func:`~lensprobe.interventions.arm_presets.arm_preset`
        tells where each value comes from.

        Args:
            model_name: a model name, with or without organisation (``"Qwen/Qwen2.5-Math-7B"``,
                ``"qwen2.5-math-7b"``), or a loaded model or its
                :class:`~lensprobe.core.models.facts.ModelFacts`: recognised by its configuration, its
                ``cfg.model_name`` only when the configuration matches none of the authors' models
                (:func:`~lensprobe.interventions.arm_presets.model_key`).
            benchmark: ``"math500"``, ``"aime2024"``, ``"aime2025"``, ``"gpqa"``, ``"humaneval"``
                or ``"livecodebench"`` (case and ``-``/``_`` ignored); ``None``: the benchmark is
                not known (e.g. problems of your own), so no preset applies.
            source: ``"code"`` (default: the released code where it has a value, else Table 9) or
                ``"paper"`` (Table 9 and the paper's text); they differ in a few cells. The ARM
                records it (:attr:`source`).
            layer_defaults: the authors' decoder-layer defaults (``c=0.13``, 99.5; what their pass@3
                code runs) where the benchmark has a setting, instead of the benchmark's
                (:data:`~lensprobe.interventions.arm_presets.LAYER_DEFAULTS`).
            fallback: :class:`ARM` settings (e.g. ``{"c": 0.1, "percentile": 95}``, the authors'
                Qwen2.5-Math-7B values on MATH-500) used when no preset applies: a model without
                presets, a cell where the authors report no ARM gain, or ``benchmark=None``.
                ``None`` (default): those are errors that say what to pass.
            **overrides: other :class:`ARM` fields (``layer``, ``seed``, ``per_row``, ...), applied
                on top of the preset or the fallback.

        Raises:
            LensprobeError: an unknown benchmark name, source or field. Without ``fallback``, also
                :class:`~lensprobe.interventions.arm_presets.NoPresetError`: an unknown model, a
                cell where the authors report no ARM gain ("-" in Table 9), or ``benchmark=None``.

        Example:
            >>> ARM.preset("Qwen/Qwen2.5-Math-7B").c
            0.1
            >>> ARM.preset("google/gemma-3-27b-it", "aime2024", source="paper").percentile
            0.85
            >>> ARM.preset("my-org/my-model", fallback={"c": 0.1, "percentile": 95}, seed=0).percentile
            95
        """
        names = [f.name for f in fields(cls)]
        unknown = (set(overrides) | set(fallback or {})) - set(names)
        if unknown:
            raise LensprobeError(f"unknown ARM field(s) {sorted(unknown)}: use {names}.")
        try:
            settings = {**arm_preset(model_name, benchmark, source, layer_defaults=layer_defaults).settings,
                        "source": f"{source} (layer defaults)" if layer_defaults else source}
        except NoPresetError:
            if fallback is None:
                raise
            settings = dict(fallback)
        return cls(**{**settings, **overrides})

    @property
    def capabilities(self) -> Capabilities:
        """A row's result depends on the other rows of its forward with ``per_row=False``; ARM's
        layer is rounding-sensitive (which activations count as near zero, and which draw each
        gets, follow the order of their magnitudes, so decode steps compute this layer and those
        before it one row at a time: :mod:`lensprobe.generation.engines.rowwise`); it draws
        random numbers (``with_default_seed``)."""
        return Capabilities(batch_dependent=not self.per_row, rounding_sensitive_layer=self.layer, seeded=True)

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
