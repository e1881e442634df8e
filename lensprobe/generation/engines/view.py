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

The recorders of :mod:`lensprobe.generation.loop` attach to the view under the same
TransformerLens hook names (see :data:`lensprobe.generation.engines.hooknames.PLAIN_HOOKS`): ``hook_embed`` (the input
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

The ``sdpa_last`` kernel is in :mod:`~lensprobe.generation.engines.attention`, the hook names a view
serves in :mod:`~lensprobe.generation.engines.hooknames`, and the decode-step thread rule in
:mod:`~lensprobe.generation.engines.threads`.

Example:
    >>> view = plain_model(model)      # None when the model cannot be viewed this way
    >>> with attached(model, view, [("blocks.0.attn.hook_pattern", fn)]):
    ...     view(tokens)
"""

import weakref
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from lensprobe.core.errors import LensprobeError
from lensprobe.generation.engines.attention import ATTENTIONS, register_sdpa_last

__all__ = ["attention_modules", "block_modules", "has_user_hooks", "mlp_modules", "plain_model"]

_WRAP = "._original_component"
_LIBRARY_HOOKS = ("transformer_lens.", "transformers.")

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

    ``None`` when ``model`` is not a ``TransformerBridge`` over a Hugging Face model (or is one placed across
    devices or offloaded with a ``device_map``: the bridge runs it), when
    its modules cannot be rebuilt unwrapped, when the rebuilt model's logits differ from
    the bridge's on a probe input, or (``"sdpa_last"``) when its attention rows differ from
    eager attention's. Built once per model (and again after its tensors change, e.g.
    after :func:`lensprobe.generation.add_thinking_token`).
    """
    if attention not in ATTENTIONS:
        raise LensprobeError(f"attention must be one of {list(ATTENTIONS)}, got {attention!r}.")
    hf = getattr(model, "original_model", None)
    if not isinstance(hf, nn.Module) or not hasattr(hf, "config") or getattr(hf, "hf_device_map", None):
        return None  # a model accelerate placed (device_map): a view would lack its hooks that move activations
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
    hf_config: Any = hf.config  # an HF config (torch types module attributes Tensor | Module)
    config = type(hf_config).from_dict(hf_config.to_dict())
    if attention == "sdpa_last":
        register_sdpa_last()
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
            module._parameters[leaf] = cast(nn.Parameter, given[name])  # the bridge's own Parameter object
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
    got: list = []  # (layer, weights) per attention call, in call order
    ref: list = []
    logits = []  # [view's, eager's] last logits of each forward
    hooks = []
    for store, m in ((got, view), (ref, eager)):
        for layer, module in attention_modules(model, m).items():
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


def attention_modules(model, view: nn.Module) -> dict[int, nn.Module]:
    """Layer -> the view's attention module (the module the bridge's ``blocks[l].attn`` wraps)."""
    return _wrapped_modules(model, view, "attn")


def mlp_modules(model, view: nn.Module) -> dict[int, nn.Module]:
    """Layer -> the view's MLP module (the module the bridge's ``blocks[l].mlp`` wraps)."""
    return _wrapped_modules(model, view, "mlp")


def block_modules(model, view: nn.Module) -> dict[int, nn.Module]:
    """Layer -> the view's decoder layer (the module the bridge's ``blocks[l]`` wraps)."""
    return _wrapped_modules(model, view, "")


def _wrapped_modules(model, view: nn.Module, part: str) -> dict[int, nn.Module]:
    names = {id(m): n for n, m in model.original_model.named_modules()}
    out = {}
    for layer, block in enumerate(model.blocks):
        wrapper = getattr(block, part, None) if part else block
        name = names.get(id(getattr(wrapper, "original_component", None)))
        if name is None:
            raise LensprobeError(f"layer {layer}: the {part or 'decoder layer'} module was not found in the plain model.")
        out[layer] = view.get_submodule(name.replace(_WRAP, ""))
    return out
