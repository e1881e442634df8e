"""An unwrapped view of a TransformerBridge's Hugging Face model, for fast generation.

A ``TransformerBridge`` wraps every submodule of its Hugging Face model in a bridge
component with hook points. With no hooks attached they change nothing, but they cost
Python time at every call: on SmolLM2-135M on a CPU one KV-cached generation step takes
about 1.4x as long through the bridge as through the same modules unwrapped. Generation
calls a forward per token, so :func:`lensprobe.generate` runs steps that need no
TransformerLens hooks (no interventions, nothing attached to the model by the user)
through :func:`plain_model`: the same model class, built on the ``meta`` device, whose
parameters and buffers **are** the bridge's tensors (no copy, no extra memory; an
in-place edit of a weight shows in both). Before a view is first used it is checked: its
logits must equal the bridge's on a short probe input, else the bridge is used.

The recorders of :mod:`lensprobe.generation` attach to the view under the same
TransformerLens hook names (see :data:`PLAIN_HOOKS`): ``hook_embed`` (the input
embedding's output; a returned tensor replaces it), ``blocks.{l}.attn.hook_pattern`` (the
attention weights the view's attention returns; read only) and ``ln_final.hook_out`` /
``ln_final.hook_normalized`` (the input of the unembedding; read only).

Attention implementations of a view (``attention=``):

- ``"eager"``: the bridge's own; returns the full ``[batch, head, query, key]`` weights.
- ``"sdpa"``: fused; faster, the same numbers up to float rounding; returns no weights.
- ``"sdpa_last"``: the output plus the **newest query's** attention weights, ``[batch,
  head, 1, key]``, computed from the post-RoPE query and the cached keys (one ``[head,
  key]`` row per sequence; what a generation trace records). The prompt forward runs fused
  sdpa for the output; a cached decode step (one query) computes the weights once and
  multiplies them by the values. A view with it is used only after its rows and logits
  match eager attention's on a probe (the prompt forward and one decode step).

Decode steps on a view of a small model run its decoder layers on one thread
(:func:`decode_threads`, :func:`layer_threads`): see :data:`ONE_THREAD_LAYER_BYTES`.

Example:
    >>> view = plain_model(model)      # None when the model cannot be viewed this way
    >>> with attached(model, view, [("blocks.0.attn.hook_pattern", fn)]):
    ...     view(tokens)
"""

import contextlib
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lensprobe.errors import LensprobeError

__all__ = ["ATTENTIONS", "ONE_THREAD_LAYER_BYTES", "ONE_THREAD_MAX_ROWS", "PLAIN_HOOKS", "attached", "decode_threads",
           "has_user_hooks", "last_query_attention", "last_query_weights", "layer_threads", "one_thread", "plain_model",
           "sdpa_last_attention", "supports"]

_WRAP = "._original_component"
PLAIN_HOOKS = ("hook_embed", "blocks.{layer}.attn.hook_pattern", "ln_final.hook_out", "ln_final.hook_normalized")
"""TransformerLens hook names a plain view can serve (to recorders: read only but ``hook_embed``)."""
_FIXED_HOOKS = ("hook_embed", "ln_final.hook_out", "ln_final.hook_normalized")
_LIBRARY_HOOKS = ("transformer_lens.", "transformers.")
ATTENTIONS = {"eager": "eager", "sdpa": "sdpa", "sdpa_last": "lensprobe_sdpa_last"}
"""Attention implementations of a plain view -> the transformers implementation name."""
ONE_THREAD_LAYER_BYTES = 4 * 2**20
"""Decode steps run a view's decoder layers on one thread when no layer weight is larger.

A decode step (one new position per row) multiplies each weight matrix by a few vectors:
it streams the weights from memory, and for small matrices waking torch's other threads
costs more than they save. The unembedding (one large matrix) keeps torch's thread count.
Measured on 2 CPU cores with ``benchmarks/decode_threads.py`` (time per step, torch's two
threads / one thread for the layers; batch 1, 4, 8): largest layer weight 3.4 MiB
(SmolLM2-135M's shapes) 1.17x, 1.11x, 1.10x; 9.4 MiB 1.04x, 0.82x, 0.76x; 24 MiB 0.81x,
0.71x, 0.67x; 64 MiB 0.71x, 0.68x, 0.67x. Set to 0 to always use torch's thread count.
"""
ONE_THREAD_MAX_ROWS = 4
"""... and when a step has at most this many rows (the gain shrinks as rows make each matmul
do more work per weight read; at 8 rows on the embedded model it was within noise)."""
_PATTERN = re.compile(r"blocks\.(\d+)\.attn\.hook_pattern")

# bridge -> (fingerprint of its tensors, view or None); weak so a deleted model frees its view
_VIEWS: "weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[tuple, nn.Module | None]]]" = weakref.WeakKeyDictionary()


def _fingerprint(hf: nn.Module) -> tuple:
    return tuple((name, id(t), t.data_ptr(), tuple(t.shape), t.dtype, t.device)
                 for name, t in [*hf.named_parameters(), *hf.named_buffers()])


def has_user_hooks(model: nn.Module) -> bool:
    """Whether a hook is attached to ``model``: on a hook point, or a torch hook of the user's.

    TransformerLens wires hooks of its own onto some wrapped modules (to feed its hook
    points), and transformers installs output-capturing hooks once attentions or hidden
    states are first asked for (they record only while such a call runs); those are not
    the user's and do not count.
    """
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    for module in model.modules():
        fns = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
        if not fns:
            continue
        if type(module).__name__ == "HookPoint":
            return True
        if any(not str(getattr(fn, "__module__", "")).startswith(_LIBRARY_HOOKS) for fn in fns):
            return True
    return False


def plain_model(model, attention: str = "eager") -> nn.Module | None:
    """The unwrapped Hugging Face model sharing ``model``'s tensors, or ``None`` if there is none.

    ``attention`` is the view's attention implementation: ``"eager"``, ``"sdpa"`` or
    ``"sdpa_last"`` (see the module docstring).

    ``None`` when ``model`` is not a ``TransformerBridge`` over a Hugging Face model, when
    its modules cannot be rebuilt unwrapped, when the rebuilt model's logits differ from
    the bridge's on a probe input, or (``"sdpa_last"``) when its attention rows differ from
    eager attention's. Built once per model (and again after its tensors change, e.g.
    after :func:`lensprobe.add_thinking_token`).
    """
    if attention not in ATTENTIONS:
        raise LensprobeError(f"attention must be one of {list(ATTENTIONS)}, got {attention!r}.")
    hf = getattr(model, "original_model", None)
    if not isinstance(hf, nn.Module) or not hasattr(hf, "config"):
        return None
    key = _fingerprint(hf)
    views = _VIEWS.setdefault(model, {})
    cached = views.get(attention)
    if cached is not None and cached[0] == key:
        return cached[1]
    view = _build(hf, attention)
    if view is not None and not _same_logits(model, view):
        view = None
    if view is not None and attention == "sdpa_last" and not _same_last_rows(model, view):
        view = None
    views[attention] = (key, view)
    return view


def _build(hf: nn.Module, attention: str = "eager") -> nn.Module | None:
    config = type(hf.config).from_dict(hf.config.to_dict())
    if attention == "sdpa_last":
        _register_sdpa_last()
    config._attn_implementation = ATTENTIONS[attention]
    try:
        with torch.device("meta"):
            view = type(hf)(config)
    except Exception:  # noqa: BLE001 - a class that cannot be rebuilt: use the bridge
        return None
    view.eval()
    wanted = {**{n: "param" for n, _ in view.named_parameters(remove_duplicate=False)},
              **{n: "buffer" for n, _ in view.named_buffers(remove_duplicate=False)}}
    given = {n.replace(_WRAP, ""): t for n, t in [*hf.named_parameters(remove_duplicate=False),
                                                  *hf.named_buffers(remove_duplicate=False)]}
    if not set(wanted) <= set(given):
        return None
    for name, kind in wanted.items():
        owner, _, leaf = name.rpartition(".")
        module = view.get_submodule(owner)
        if kind == "param":
            module._parameters[leaf] = given[name]  # the bridge's own Parameter object
        else:
            module._buffers[leaf] = given[name]
    tensors = [*view.parameters(), *view.buffers(),  # and plain tensor attributes made on meta
               *(v for m in view.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))]
    return None if any(t.is_meta for t in tensors) else view


def _same_logits(model, view: nn.Module) -> bool:
    """Whether the view computes the bridge's logits on a short probe input."""
    vocab = int(model.cfg.d_vocab)
    device = next(view.parameters()).device
    probe = torch.tensor([[1 % vocab, 2 % vocab, 3 % vocab, 5 % vocab]], device=device)
    try:
        with torch.inference_mode():
            ref = model(probe, return_type="logits").float()
            got = view(input_ids=probe, use_cache=False).logits.float()
    except Exception:  # noqa: BLE001 - any failure means: do not use the view
        return False
    if got.shape != ref.shape:
        return False
    # eager gives the bridge's logits exactly; sdpa differs by float rounding (~1e-5 relative)
    return bool((got - ref).abs().max() <= 1e-4 * ref.abs().max().clamp(min=1.0))


def _same_last_rows(model, view: nn.Module) -> bool:
    """Whether the view's newest-query attention rows and logits equal eager attention's.

    On a left-padded probe: the prompt forward (several queries: fused attention plus the
    last row) and then one cached decode step (one query: the row's own attention output).
    """
    eager = plain_model(model, "eager")
    if eager is None:
        return False
    vocab = int(model.cfg.d_vocab)
    device = next(view.parameters()).device
    probe = torch.tensor([[1, 2, 3, 5, 8, 13], [0, 0, 4, 6, 9, 11]], device=device) % vocab
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]], device=device)
    step = torch.tensor([[21], [7]], device=device) % vocab
    positions = torch.tensor([[6], [4]], device=device)
    got, ref = [], []  # (layer, weights) per attention call, in call order
    logits = []  # [view's, eager's] last logits of each forward
    hooks = []
    for store, m in ((got, view), (ref, eager)):
        for layer, module in _attention_modules(model, m).items():
            hooks.append(module.register_forward_hook(
                lambda _m, _a, out, store=store, layer=layer: store.append((layer, out[1]))))
    try:
        with torch.inference_mode():
            for m in (view, eager):
                first = m(input_ids=probe, attention_mask=mask, use_cache=True)
                then = m(input_ids=step, attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
                         position_ids=positions, past_key_values=first.past_key_values, use_cache=True)
                logits.append([first.logits[:, -1].float(), then.logits[:, -1].float()])
    except Exception:  # noqa: BLE001 - any failure means: do not use the view
        return False
    finally:
        for h in hooks:
            h.remove()
    if not ref or len(got) != len(ref):
        return False
    for (layer, row), (ref_layer, weights) in zip(got, ref, strict=True):
        if layer != ref_layer or not isinstance(row, torch.Tensor) or row.shape != weights[:, :, -1:].shape:
            return False
        if not torch.allclose(row.float(), weights[:, :, -1:].float(), atol=1e-5, rtol=1e-4):
            return False
    for a, b in zip(*logits, strict=True):
        if not (a - b).abs().max() <= 1e-4 * b.abs().max().clamp(min=1.0):
            return False
    return True


# ----- sdpa with the newest query's weights -----------------------------------------------
def _register_sdpa_last() -> None:
    """Register :func:`sdpa_last_attention` (and sdpa's mask) with transformers, once."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = ATTENTIONS["sdpa_last"]
    if name not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(name, sdpa_last_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


_DECODE_KWARGS = frozenset({"position_ids", "cache_position", "output_attentions", "use_cache", "is_causal",
                            "sliding_window"})
"""Keyword arguments an attention call may carry and still take the one-query path of
:func:`sdpa_last_attention` (anything else, e.g. ``softcap``, ``sinks``, goes through sdpa)."""


def sdpa_last_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                        **kwargs):
    """Attention output plus the newest query's attention weights ``[batch, head, 1, key]``.

    ``query`` ``[batch, head, q, d]`` is post-RoPE and ``key`` ``[batch, kv_head, key, d]``
    holds every cached key (GQA: query head ``h`` reads kv head ``h // group``);
    ``attention_mask`` is sdpa's boolean mask (``True`` = attend) or ``None`` (attend to all,
    which holds for the newest query under a causal mask).

    Several queries (the prompt forward): fused sdpa, plus :func:`last_query_weights`. One
    query (a cached decode step) with no dropout or other extras: the weights are computed
    once and give the output too (:func:`last_query_attention`), instead of sdpa computing
    them again.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] == 1 and not dropout and all(k in _DECODE_KWARGS or v is None for k, v in kwargs.items()):
        with one_thread():
            return last_query_attention(query, key, value, attention_mask, scaling)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    with one_thread():
        return out, last_query_weights(query, key, attention_mask, scaling)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the enclosed torch ops on one thread (the previous thread count is restored on exit).

    For the tiny per-step recording ops (a ``[head, key]`` row per layer): torch splits some
    of them (softmax, exp) across threads, and waking the other threads costs more than the
    op itself (about 15 us per op on 2 cores with ``OMP_WAIT_POLICY=PASSIVE``, vs 2 us).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decode_threads(view: nn.Module, rows: int) -> int:
    """Threads for ``view``'s decoder layers in a decode step of ``rows`` rows.

    One when ``rows <= ONE_THREAD_MAX_ROWS`` and no layer weight matrix is larger than
    :data:`ONE_THREAD_LAYER_BYTES`, else torch's thread count. The thread count does not
    change the results at one row (each output is one dot product either way); at several
    rows the matmul may split its sums differently (float rounding, ~1e-6 relative).
    """
    if rows > ONE_THREAD_MAX_ROWS:
        return torch.get_num_threads()
    embeddings = view.get_input_embeddings()
    sizes = [m.weight.numel() * m.weight.element_size() for m in view.base_model.modules()
             if m is not embeddings and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.ndim == 2]
    if sizes and max(sizes) <= ONE_THREAD_LAYER_BYTES:
        return 1
    return torch.get_num_threads()


@contextlib.contextmanager
def layer_threads(view: nn.Module, threads: int) -> Iterator[None]:
    """While open, forwards of ``view`` that add one position per row run its decoder layers on ``threads``.

    The unembedding and every other forward keep torch's thread count. The count is set by
    hooks on the decoder stack (``view.base_model``), which are removed on exit, and the
    count at entry is restored, also after an exception or a KeyboardInterrupt. torch's
    thread count is process-wide: generations running concurrently in several Python
    threads see each other's setting (only their speed changes, not their numbers).
    """
    before = torch.get_num_threads()
    if threads == before:
        yield
        return

    def enter(_m, args, kwargs):
        x = kwargs.get("input_ids")
        x = kwargs.get("inputs_embeds") if x is None else x
        x = args[0] if x is None and args else x
        if isinstance(x, torch.Tensor) and x.ndim >= 2 and x.shape[1] == 1:
            torch.set_num_threads(threads)

    def leave(_m, _args, _out):
        torch.set_num_threads(before)

    stack = view.base_model
    handles = [stack.register_forward_pre_hook(enter, with_kwargs=True), stack.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        torch.set_num_threads(before)


def _last_query_probs(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None) -> torch.Tensor:
    """softmax(q_last . k * scale + mask) over the keys, as ``[batch, kv_head, key, group]`` floats.

    GQA without copying the keys: each kv group's keys ``[key, d]`` multiply the group's
    query heads ``[d, group]`` in one matmul. (Keys on the left: with the keys transposed on
    the right, the CPU matmul keeps a kernel per key length, which grows memory by tens of
    MiB over a long generation.)
    """
    b, h, _q, d = query.shape
    kv = key.shape[1]
    scale = d ** -0.5 if scaling is None else scaling
    q = query[:, :, -1, :].reshape(b, kv, h // kv, d).transpose(-1, -2)  # [b, kv, d, group]
    scores = torch.matmul(key, q).float() * scale  # [b, kv, key, group]
    if attention_mask is not None:
        last = attention_mask[:, :, -1, : scores.shape[-2]]  # [b, 1 or h, key]
        last = (last.reshape(b, 1, -1, 1) if last.shape[1] == 1
                else last.reshape(b, kv, h // kv, -1).transpose(-1, -2))
        scores = (scores.masked_fill(~last, float("-inf")) if last.dtype == torch.bool
                  else scores + last.float())
    return torch.softmax(scores, dim=-2)


def _as_rows(probs: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``[batch, kv_head, key, group]`` probabilities as ``[batch, head, 1, key]`` weights in the query's dtype."""
    return probs.transpose(-1, -2).reshape(query.shape[0], query.shape[1], 1, -1).to(query.dtype)


def last_query_weights(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                       scaling: float | None = None) -> torch.Tensor:
    """softmax(q_last . k * scale + mask) for the newest query: ``[batch, head, 1, key]``.

    ``attention_mask`` is boolean (``True`` = attend) or additive, ``[batch, 1 or head, q,
    key]``, or ``None``; ``scaling`` defaults to ``1 / sqrt(d)``.
    """
    return _as_rows(_last_query_probs(query, key, attention_mask, scaling), query)


def last_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the newest query: output ``[batch, 1, head, d]`` and weights ``[batch, head, 1, key]``.

    The output is laid out as transformers' attention functions return it (query position
    before head). Values on the left of the matmul, as the keys in the scores.
    """
    b, h, _q, d = query.shape
    probs = _last_query_probs(query, key, attention_mask, scaling)  # [b, kv, key, group]
    out = torch.matmul(value.transpose(-1, -2), probs.to(value.dtype))  # [b, kv, d, group]
    out = out.transpose(-1, -2).reshape(b, 1, h, value.shape[-1])
    return out, _as_rows(probs, query)


def supports(hook_names: Sequence[str]) -> bool:
    """Whether every hook name is one a plain view can serve."""
    return all(name in _FIXED_HOOKS or _PATTERN.fullmatch(name) for name in hook_names)


def _attention_modules(model, view: nn.Module) -> dict[int, nn.Module]:
    """Layer -> the view's attention module (the module the bridge's ``blocks[l].attn`` wraps)."""
    names = {id(m): n for n, m in model.original_model.named_modules()}
    out = {}
    for layer, block in enumerate(model.blocks):
        name = names.get(id(getattr(block.attn, "original_component", None)))
        if name is None:
            raise LensprobeError(f"layer {layer}: the attention module was not found in the plain model.")
        out[layer] = view.get_submodule(name.replace(_WRAP, ""))
    return out


@contextlib.contextmanager
def attached(model, view: nn.Module, hooks: Sequence[tuple[str, Callable[[torch.Tensor, Any], Any]]]) -> Iterator[nn.Module]:
    """Attach recorder hooks (TransformerLens names, ``fn(activation, hook)``) to a plain view.

    Every hook is removed on exit, also after an exception or a KeyboardInterrupt.
    """
    handles = []
    attention = _attention_modules(model, view) if any(_PATTERN.fullmatch(n) for n, _ in hooks) else {}
    try:
        for name, fn in hooks:
            handles.append(_attach(view, attention, name, fn))
        yield view
    finally:
        for handle in handles:
            handle.remove()


def _attach(view: nn.Module, attention: dict[int, nn.Module], name: str, fn):
    if name == "hook_embed":
        return view.get_input_embeddings().register_forward_hook(lambda _m, _args, out: fn(out, None))
    if name in ("ln_final.hook_out", "ln_final.hook_normalized"):
        def before_unembed(_m, args):
            fn(args[0], None)

        return view.get_output_embeddings().register_forward_pre_hook(before_unembed)
    match = _PATTERN.fullmatch(name)
    if match:
        def pattern(_m, _args, out):
            weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if not isinstance(weights, torch.Tensor) or weights.ndim != 4:
                raise LensprobeError(
                    f"{name}: the plain model's attention returned no attention weights; "
                    "run with engine='bridge'."
                )
            fn(weights, None)

        return attention[int(match.group(1))].register_forward_hook(pattern)
    raise LensprobeError(f"hook point {name!r} cannot be served by the plain model; run with engine='bridge'.")
