"""The logit lens at every step of a generation: ``lens=`` of :func:`lensprobe.generate`.

``lens="logit"`` reads each chosen layer's residual stream (``blocks.{l}.hook_resid_post``) at every row's
newest position and puts it through the model's **own** final norm and unembedding (a bridge's Hugging Face
norm and ``lm_head``, a ``HookedTransformer``'s ``ln_final`` and ``unembed``, with the unembedding bias and
any final logit soft-capping the model applies, such as Gemma's ``final_logit_softcapping``), so the last
layer's lens is the model's own next-token distribution. A **translator** (a tuned lens) plugs in before the
final norm: any ``translator(layer, resid) -> resid`` (``resid`` is ``[batch, d_model]`` in the model's
dtype), or :class:`AffineLens`, an affine map per layer.

The hooks keep only the newest position's ``[batch, d_model]`` per layer of the current forward. After the
step's tokens are chosen (:class:`~lensprobe.generation.step.Step`), the live rows' residual streams wait (a
copy, with the rows' next-token log-probabilities) until the steps waiting make
:data:`~lensprobe.generation.lens.BATCH_COLUMNS` columns (``rows x layers``; at most
:data:`~lensprobe.generation.lens.BATCH_STEPS` steps, and the last ones when the trace is built); then one
``[columns, d_model] @ [d_model, vocab]`` product is reduced step by step to what
:class:`~lensprobe.generation.traces.lens.LensTrace` keeps: entropy, top-k ids and probabilities, the chosen
token's rank and probability, and KL(model || layer). Nothing of ``vocab`` size outlives those few steps.

Rows are written by their index in the trace at their own step, so continuous batching, refill, left padding
and several samples per prompt give each row what it gives alone (up to float rounding). The residual stream
is read as it reaches the hook point (before an intervention attached at that same hook point edits it), as
``record=`` reads it; interventions elsewhere (head ablation, ARM, latent thinking inputs) show in it.

Example:
    >>> out = lp.generate(model, prompt, max_new_tokens=32, lens="logit", lens_top_k=3)
    >>> out.lens.entropy.shape                       # [step, layer]
    >>> tuned = lp.generation.AffineLens(weights, biases)   # [layer, d_model, d_model], [layer, d_model]
    >>> out = lp.generate(model, prompt, max_new_tokens=32, lens=tuned)
"""

import weakref
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, intervene
from lensprobe.core.models.devices import model_device, model_dtype
from lensprobe.core.models.kinds import is_hooked_transformer
from lensprobe.core.models.loading import check_layers
from lensprobe.core.storage.identity import identity_digest
from lensprobe.generation.engines.view import has_user_hooks
from lensprobe.generation.traces.lens import LensTrace

__all__ = ["AffineLens", "LogitLens", "final_head", "lens_hook_names", "logit_lens"]

_CHECKED: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()
_TL_NORMS = ("LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")
BATCH_COLUMNS = 128
"""The lens waits until its steps make this many columns (``layers x rows``) before the unembedding product."""
BATCH_STEPS = 8
"""... or until this many steps wait: what waits is ``BATCH_STEPS`` times the rows' ``[d_vocab]`` log-probabilities."""


class AffineLens:
    """A tuned lens's translators: ``resid -> resid @ weights[layer] + biases[layer]`` per layer.

    Args:
        weights: ``[n_layers, d_model, d_model]`` (row vectors: ``resid @ weights[layer]``), or ``None``
            for the identity at every layer.
        biases: ``[n_layers, d_model]``, or ``None`` for zero.

    A translator trained with the ``tuned-lens`` package (``h + A h + b``, ``A`` a ``Linear``'s weight) is
    ``weights[layer] = I + A.T`` and ``biases[layer] = b``. Train translators with the tool of your choice;
    lensprobe applies them. ``AffineLens()`` (the identity) is the logit lens.

    Example:
        >>> tuned = lp.generation.AffineLens(torch.eye(64).repeat(2, 1, 1), torch.zeros(2, 64))
        >>> out = lp.generate(model, prompt, max_new_tokens=8, lens=tuned)
    """

    def __init__(self, weights: Float[Tensor, "layer d_model d_model"] | None = None,
                 biases: Float[Tensor, "layer d_model"] | None = None) -> None:
        for name, value, ndim in (("weights", weights, 3), ("biases", biases, 2)):
            if value is not None and (not isinstance(value, Tensor) or value.ndim != ndim or not value.is_floating_point()
                                      or not bool(torch.isfinite(value).all())):
                raise LensprobeError(f"AffineLens {name} must be a finite float tensor of {ndim} dimensions "
                                     f"([layer, d_model{', d_model' if ndim == 3 else ''}]) or None, got {_what(value)}.")
        if weights is not None and weights.shape[1] != weights.shape[2]:
            raise LensprobeError(f"AffineLens weights must be square per layer ([layer, d_model, d_model]), got "
                                 f"{tuple(weights.shape)}.")
        if weights is not None and biases is not None and (biases.shape[0], biases.shape[1]) != weights.shape[:2]:
            raise LensprobeError(f"AffineLens biases {tuple(biases.shape)} do not fit weights {tuple(weights.shape)}: "
                                 "give one [d_model] bias per layer of the weights.")
        self.weights = None if weights is None else weights.detach()
        self.biases = None if biases is None else biases.detach()

    def check(self, n_layers: int, d_model: int) -> None:
        """Refuse translators that do not fit a model of ``n_layers`` layers of width ``d_model``."""
        for name, value in (("weights", self.weights), ("biases", self.biases)):
            if value is not None and (value.shape[0] != n_layers or value.shape[-1] != d_model):
                raise LensprobeError(f"AffineLens {name} {tuple(value.shape)} do not fit this model ({n_layers} layers, "
                                     f"d_model {d_model}): give one translator per layer of the model.")

    def __call__(self, layer: int, resid: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_model"]:
        out = resid if self.weights is None else resid @ self.weights[layer].to(resid.device, resid.dtype)
        return out if self.biases is None else out + self.biases[layer].to(resid.device, resid.dtype)

    def __repr__(self) -> str:
        shape = None if self.weights is None else tuple(self.weights.shape)
        return f"AffineLens(weights={shape}, biases={None if self.biases is None else tuple(self.biases.shape)})"


def _what(value) -> str:
    return f"shape {tuple(value.shape)}, {value.dtype}" if isinstance(value, Tensor) else type(value).__name__


def lens_hook_names(model, layers) -> list[str]:
    """The hook points the lens reads: each layer's ``hook_resid_post``."""
    return [f"blocks.{layer}.hook_resid_post" for layer in layers]


def final_head(model) -> Callable[[Tensor], Tensor]:
    """``resid [n, d_model] -> logits [n, d_vocab]`` (float32) through the model's own final norm,
    unembedding (with its bias) and final logit soft-capping, firing no hook point.

    Raises:
        LensprobeError: a model whose final norm or unembedding lensprobe cannot find.
    """
    if is_hooked_transformer(model):
        norm = _tl_norm(model)
        W_U, b_U = model.unembed.W_U, _nonzero(model.unembed.b_U)
        cap = getattr(model.cfg, "output_logits_soft_cap", None)
        if b_U is None:
            return lambda x: _capped(torch.mm(norm(x.to(W_U.device)), W_U).float(), cap)
        return lambda x: _capped(torch.addmm(b_U, norm(x.to(W_U.device)), W_U).float(), cap)
    return _bridge_head(model)


def _bridge_head(model) -> Callable[[Tensor], Tensor]:
    """A bridge's Hugging Face final norm and ``lm_head`` (the modules it wraps: no hook point fires)."""
    norm: Any = getattr(getattr(model, "ln_final", None), "original_component", None)
    head: Any = getattr(getattr(model, "unembed", None), "original_component", None)
    if not isinstance(norm, nn.Module) or not isinstance(getattr(head, "weight", None), Tensor):
        raise LensprobeError("the logit lens needs the model's final norm and unembedding (a TransformerBridge's "
                             "ln_final and unembed, or a HookedTransformer's): this model has none it can use.")
    config: Any = getattr(getattr(model, "original_model", None), "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "final_logit_softcapping", None)
    weight, bias = head.weight, _nonzero(getattr(head, "bias", None))
    return lambda x: _capped(_unembed(norm(x.to(weight.device)), weight, bias).float(), cap)


def _nonzero(bias: Tensor | None) -> Tensor | None:
    """The unembedding bias, or ``None`` when it is all zeros (adding zeros changes no logit; skipping it saves a
    pass over ``[rows x layers, vocab]``)."""
    return None if bias is None or not bool(bias.any()) else bias


def _unembed(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(h, weight, bias)`` computed as ``weight @ h.T``, fewer than 64 rows padded with zero rows to a
    power of two (at least 2): the CPU kernels split the vocabulary over the threads this way (``F.linear`` with
    few rows ran on one) and run a small power of two of columns fastest. Measured on 2 cores with the embedded
    model's ``[49152, 576]`` unembedding inside a generation (caches cold after the forward), per column: 1
    column 10 ms, 2 columns 2 ms each (``F.linear``: 11 ms each); 30 columns 0.75 ms, 32 columns 0.6 ms; 120
    columns unpadded 0.45 ms with the transpose (padded to 128, the same product and a transpose twice as slow;
    ``h @ weight.T`` 0.7 ms)."""
    n = h.shape[0]
    padded = max(2, 1 << (n - 1).bit_length()) if n < 64 else n
    if padded != n:
        h = torch.cat([h, h.new_zeros((padded - n, h.shape[1]))])
    out = torch.mm(weight, h.t()) if bias is None else torch.addmm(bias[:, None], weight, h.t())
    return (out[:, :n] if padded != n else out).t().contiguous()


def _capped(logits: Tensor, cap) -> Tensor:
    return logits if not cap or cap <= 0 else cap * torch.tanh(logits / cap)


def _tl_norm(model) -> Callable[[Tensor], Tensor]:
    """A HookedTransformer's ``ln_final`` computed as its module computes it, without its hook points."""
    if getattr(model.cfg, "normalization_type", None) is None:
        return lambda x: x
    module = model.ln_final
    kind = type(module).__name__
    if kind not in _TL_NORMS:
        raise LensprobeError(f"the logit lens knows the final norms {_TL_NORMS} of a HookedTransformer, not {kind}.")
    dtype, eps = model.cfg.dtype, module.eps

    def norm(x: Tensor) -> Tensor:
        h = x if x.dtype in (torch.float32, torch.float64) else x.float()
        if kind.startswith("LayerNorm"):
            h = h - h.mean(-1, keepdim=True)
        h = (h / (h.pow(2).mean(-1, keepdim=True) + eps).sqrt()).to(dtype)
        return h * module.w + module.b if kind == "LayerNorm" else h * module.w if kind == "RMSNorm" else h
    return norm


def check_final_head(model, head: Callable[[Tensor], Tensor]) -> None:
    """Refuse a model whose last layer's lens is not its own logits, on a 5-token probe (once per model).

    Raises:
        LensprobeError: the final norm and unembedding lensprobe applies do not give the model's logits
            (a head it does not know, such as a logit scale); names the difference.
    """
    if _CHECKED.get(model) or has_user_hooks(model):  # the user's hooks could change the probe
        return
    kept: dict[str, Tensor] = {}
    last = f"blocks.{int(model.cfg.n_layers) - 1}.hook_resid_post"
    probe = torch.tensor([[1, 2, 3, 5, 8]], device=model_device(model)) % int(model.cfg.d_vocab)
    with torch.inference_mode(), intervene(model, (last, lambda x, hook: kept.__setitem__("x", x[0].clone()))):
        want = model(probe, return_type="logits")[0].float()
        got = head(kept["x"])
    tol = 1e-3 if want.dtype == torch.float32 and kept["x"].dtype == torch.float32 else 3e-2
    diff = float((got - want).abs().max())
    if not diff <= tol * float(want.abs().max().clamp(min=1.0)):
        raise LensprobeError(f"the logit lens's last layer differs from this model's logits by {diff:.3g} on a probe: "
                             "its head does something lensprobe does not apply (a logit scale?); pass lens= a "
                             "translator that makes up for it, or use record='blocks.*.hook_resid_post'.")
    _CHECKED[model] = True


def logit_lens(model, lens, top_k, layers, n_rows: int, max_steps: int) -> "LogitLens | None":
    """The recorder of ``lens=`` (``None``: no lens), every setting checked before any forward.

    Raises:
        LensprobeError: ``lens`` neither ``"logit"`` nor a translator, a ``top_k`` that is not a whole number
            in ``1..d_vocab``, bad layers, or a translator that does not map ``[1, d_model]`` to ``[1, d_model]``.
    """
    if lens is None:
        return None
    if not (isinstance(lens, str) and lens == "logit") and (isinstance(lens, str) or not callable(lens)):
        raise LensprobeError(f"lens must be 'logit', a translator fn(layer, resid) -> resid (e.g. "
                             f"lp.generation.AffineLens) or None, got {lens!r}.")
    vocab, d_model = int(model.cfg.d_vocab), int(model.cfg.d_model)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= vocab:
        raise LensprobeError(f"lens_top_k must be a whole number from 1 to the vocabulary ({vocab}), got {top_k!r}.")
    layers = check_layers(model, layers)
    head = final_head(model)
    if isinstance(lens, AffineLens):
        lens.check(int(model.cfg.n_layers), d_model)
    if callable(lens):
        _check_translator(model, lens, layers, d_model)
    else:
        check_final_head(model, head)
    return LogitLens(lens, layers, top_k, head, n_rows, max_steps)


def _check_translator(model, translator, layers: list[int], d_model: int) -> None:
    x = torch.zeros((1, d_model), dtype=model_dtype(model), device=model_device(model))
    for layer in layers:
        try:
            with torch.inference_mode():
                out = translator(layer, x)
        except LensprobeError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's translator: named in one error
            raise LensprobeError(f"lens: the translator failed on layer {layer}'s residual stream [1, {d_model}]: "
                                 f"{type(err).__name__}: {err}") from err
        if not isinstance(out, Tensor) or tuple(out.shape) != (1, d_model):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise LensprobeError(f"lens: the translator must return [batch, d_model] ([1, {d_model}] here) for "
                                 f"layer {layer}, got {got}.")


class LogitLens:
    """The buffers and hooks of ``lens=`` for one generation (built by :func:`logit_lens`)."""

    def __init__(self, lens, layers: list[int], top_k: int, head: Callable[[Tensor], Tensor], n_rows: int,
                 max_steps: int) -> None:
        self.lens, self.layers, self.top_k, self.head = lens, layers, top_k, head
        self.translator = None if isinstance(lens, str) else lens
        self.n_rows, self.max_steps = n_rows, max_steps
        self.resid: Tensor | None = None  # [layer, batch, d_model] of the current forward
        self.out: dict[str, Tensor] = {}
        self.waiting: list[tuple[Tensor, ...]] = []  # steps whose lens is not computed yet (see record)
        self.described = _describe(lens)  # once per generation: an AffineLens's values are hashed

    def hooks(self, model) -> list[Hook]:
        return [(name, self._hook(i)) for i, name in enumerate(lens_hook_names(model, self.layers))]

    def _hook(self, i: int):
        def keep(x: Tensor, hook) -> None:
            new = x[:, -1].detach()
            if self.resid is None or self.resid.shape[1:] != new.shape or self.resid.dtype != new.dtype:
                self.resid = new.new_empty((len(self.layers), *new.shape))
            self.resid[i].copy_(new)

        return keep

    def record(self, rows: Tensor, steps: Tensor, ran: Tensor, model_logp: Tensor, choice: Tensor,
               broken: Tensor) -> None:
        """The lens of the batch rows ``ran`` (their trace rows ``rows`` and steps ``steps``, on the CPU), from the
        model's next-token log-probabilities ``model_logp`` and the tokens recorded ``choice`` (batch-sized);
        ``broken``: rows whose logits were not finite (no model distribution: KL NaN, no chosen token).

        The step's inputs (``[layer, rows, d_model]`` and the rows' log-probabilities) wait until one more step
        would pass :data:`~lensprobe.generation.lens.BATCH_COLUMNS` columns (or
        :data:`~lensprobe.generation.lens.BATCH_STEPS` steps wait): one product over them all costs far less per
        column than one per step (on 2 cores, the embedded model's unembedding took 22 ms for one step's 30
        columns, 74 ms for four steps' 120, in a generation)."""
        if self.resid is None or not bool(ran.any()):
            return
        idx = ran.nonzero().flatten()
        x = self.resid[:, idx.to(self.resid.device)]  # [layer, n, d]: a copy (the hooks reuse self.resid)
        if self.translator is not None:
            x = torch.stack([self.translator(layer, x[i]) for i, layer in enumerate(self.layers)]).to(x.dtype)
        cpu = idx.cpu()
        self.waiting.append((x, model_logp[idx], choice[idx], broken[idx], rows[cpu], steps[cpu]))
        columns = sum(w[0].shape[0] * w[0].shape[1] for w in self.waiting)
        if columns + x.shape[0] * x.shape[1] > BATCH_COLUMNS or len(self.waiting) >= BATCH_STEPS:
            self.flush()  # another step like this one would not fit

    def flush(self) -> None:
        """Compute and keep the lens of every step waiting: one product, reduced step by step."""
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        flat = [x.reshape(x.shape[0] * x.shape[1], -1) for x, *_ in waiting]
        with torch.inference_mode():  # also when the trace's results ask for the last steps
            every = self.head(torch.cat(flat) if len(flat) > 1 else flat[0])  # [columns, vocab], float32
            for (x, model_logp, choice, broken, r, t), logits in zip(waiting, every.split([len(f) for f in flat]),
                                                                     strict=True):
                self._keep(logits, x.shape[0], x.shape[1], model_logp, choice, broken, r, t)

    def _keep(self, logits: Tensor, L: int, n: int, model_logp: Tensor, choice: Tensor, broken: Tensor, r: Tensor,
              t: Tensor) -> None:
        values = _reduce(logits, model_logp.to(logits.device), choice.to(logits.device).repeat(L), self.top_k)
        no_model = broken.to(logits.device).repeat(L)
        values["chosen_rank_rows"] = values["chosen_rank_rows"].masked_fill(no_model, -1)
        for name in ("kl_rows", "chosen_prob_rows"):
            values[name] = values[name].masked_fill(no_model, float("nan"))
        values = {name: v.view(L, n, *v.shape[1:]) for name, v in values.items()}
        for name, v in values.items():
            buf = self.out.get(name)
            if buf is None:
                fill = -1 if name in ("top_ids_rows", "chosen_rank_rows") else float("nan")
                dtype = torch.long if fill == -1 else torch.float32
                buf = self.out[name] = torch.full((self.n_rows, self.max_steps, *v.shape[:1], *v.shape[2:]), fill,
                                                  dtype=dtype, device=v.device)
            buf[r.to(buf.device), t.to(buf.device)] = v.transpose(0, 1).to(buf.dtype)

    def results(self, ran: Tensor, tokenizer) -> LensTrace:
        """The :class:`~lensprobe.generation.traces.lens.LensTrace` on the CPU, trimmed to the trace's steps;
        ``ran`` (``[row, step]``) says which steps each row ran (the rest NaN and -1)."""
        self.flush()
        n_steps, L, k = ran.shape[1], len(self.layers), self.top_k
        shapes = {"top_ids_rows": (k,), "top_probs_rows": (k,)}
        out = {}
        for name in ("entropy_rows", "top_ids_rows", "top_probs_rows", "chosen_rank_rows", "chosen_prob_rows",
                     "kl_rows"):
            fill = -1 if name in ("top_ids_rows", "chosen_rank_rows") else float("nan")
            buf = self.out.get(name)
            value = (buf[:, :n_steps].cpu().clone() if buf is not None else
                     torch.full((self.n_rows, n_steps, L, *shapes.get(name, ())), fill,
                                dtype=torch.long if fill == -1 else torch.float32))
            value[~ran] = fill
            out[name] = value
        ids = sorted(set(out["top_ids_rows"][out["top_ids_rows"] >= 0].tolist()))
        texts = tokenizer.batch_decode([[i] for i in ids]) if ids and tokenizer is not None else [str(i) for i in ids]
        return LensTrace(list(self.layers), **out, lens=self.described, token_text=dict(zip(ids, texts, strict=True)))

    def describe(self) -> dict[str, Any]:
        """The lens's settings (for the trace's meta)."""
        return {"lens": self.described, "layers": list(self.layers), "top_k": self.top_k}


def _reduce(logits: Tensor, model_logp: Tensor, chosen: Tensor, top_k: int) -> dict[str, Tensor]:
    """What the lens keeps of ``logits`` ``[layer x n, vocab]`` (float32; row ``i`` against the model's
    log-probabilities ``model_logp[i % n]`` ``[n, vocab]`` and the token ``chosen[i]``), every layer and row at
    once: one log-softmax and its exp, one top-k, the rank as a count of larger logits (summed in int32, twice as
    fast as int64), the entropy and KL divergence as dot products over the vocabulary; no loop, no host sync."""
    m, n = logits.shape[0], model_logp.shape[0]
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    ent = -torch.linalg.vecdot(probs, logp)  # logits are finite, so 0 * logp is 0 where probs underflow
    top_logp, top_ids = logp.topk(top_k, dim=-1)
    mine = chosen.clamp(min=0)[:, None]
    rank = (logits > logits.gather(-1, mine)).sum(-1, dtype=torch.int32)
    model_logp = model_logp.clamp(min=torch.finfo(model_logp.dtype).min)  # -inf (p 0) adds 0, not NaN
    per_layer = logp.view(m // n, n, -1)
    kl = torch.linalg.vecdot(model_logp.exp()[None], model_logp[None] - per_layer).reshape(m).clamp(min=0)  # rounding
    return {"entropy_rows": ent, "top_ids_rows": top_ids, "top_probs_rows": top_logp.exp(), "chosen_rank_rows": rank,
            "kl_rows": kl, "chosen_prob_rows": probs.gather(-1, mine)[:, 0]}


def _describe(lens) -> Any:
    """What was applied, for the trace's meta: ``"logit"``; an :class:`AffineLens` by its shapes and the digest of
    its values (two lenses of other weights are told apart, two of the same values are the same; a run's identity
    hashes them the same way); another translator by its name."""
    if isinstance(lens, str):
        return lens
    if isinstance(lens, AffineLens):
        parts = [f"{name}={'None' if value is None else tuple(value.shape)}"
                 + ("" if value is None else f" #{identity_digest(value)}")
                 for name, value in (("weights", lens.weights), ("biases", lens.biases))]
        return f"AffineLens({', '.join(parts)})"
    return getattr(lens, "__qualname__", type(lens).__name__)
