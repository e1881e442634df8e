"""What a generation records inside its hooks, and the latent inputs it writes back.

:class:`StepRecorder` keeps one ``[row, head, set]`` block of attention per layer and step
(the newest query's attention summed over each tracked set, reduced inside the hook: never a
``[query, key]`` matrix), the final hidden state of the newest position (for latent
thinking), and replaces the newest position's input embedding with latent vectors.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, pattern_hook_name
from lensprobe.core.models.kinds import is_hooked_transformer
from lensprobe.generation.engines.threads import one_thread

__all__ = ["StepRecorder", "final_hidden_hook", "recorded_hook_names"]


def final_hidden_hook(model) -> str:
    """The hook point holding the input of the unembedding (the final hidden state, after the final norm's weight).

    A bridge's ``ln_final.hook_out``; a HookedTransformer's ``unembed.hook_in`` (its
    ``ln_final.hook_normalized`` comes before the norm's weight).

    Raises:
        LensprobeError: no such hook point, or a HookedTransformer whose final norm weight was folded
            into the unembedding (that hidden state no longer exists in it).
    """
    names = model.hook_dict
    if is_hooked_transformer(model) and str(model.cfg.normalization_type).endswith("Pre"):
        raise LensprobeError(
            "LatentFusion needs the final hidden state after the final norm's weight, but this HookedTransformer "
            f"has its norm weights folded into the next layers (normalization_type={model.cfg.normalization_type!r}): "
            "load it with HookedTransformer.from_pretrained_no_processing(...) or from_pretrained(..., fold_ln=False)."
        )
    for name in ("ln_final.hook_out", "unembed.hook_in", "ln_final.hook_normalized"):
        if name in names:
            return name
    raise LensprobeError("this model has no ln_final hook point; LatentFusion needs the final hidden state.")


def recorded_hook_names(model, layers: Sequence[int], latent: bool) -> list[str]:
    """The hook points a trace's :class:`StepRecorder` attaches to (what its engine must serve):
    ``hook_embed`` and the final hidden state for latent thinking, the attention patterns of ``layers``.

    Example:
        >>> recorded_hook_names(model, [0], latent=False)
        ['blocks.0.attn.hook_pattern']
    """
    hidden = [final_hidden_hook(model)] if latent else []
    return [*(["hook_embed"] if latent else []), *(pattern_hook_name(layer) for layer in layers), *hidden]


class StepRecorder:
    """Per-step buffers of one generation; its hooks reduce activations inside the hook.

    Args:
        layers: layers whose attention is recorded.
        n_rows, n_sets, n_heads, max_steps: buffer sizes.
        masks: ``[row, T, set]`` float membership of every padded position in each tracked
            set (grown by the loop as positions are added), or ``None`` (no attention).
        want_hidden: hook name of the final hidden state to keep, or ``None``.
        device: where the buffers live (the model's device).

    Attributes:
        attn: ``[step, layer, row, head, set]`` (NaN where a row had ended), or ``None``.
        step: the step the hooks write to (set by the loop).
        hidden: ``[row, d_model]`` final hidden state of the newest position.
    """

    def __init__(self, layers: list[int], n_rows: int, n_sets: int, n_heads: int, max_steps: int,
                 masks: Tensor | None, want_hidden: str | None, device):
        self.layers = layers
        self.step = 0
        self.masks = masks
        self.attn = (torch.full((max_steps, len(layers), n_rows, n_heads, n_sets), float("nan"), device=device)
                     if masks is not None and layers else None)
        self.want_hidden = want_hidden
        self.latent = want_hidden is not None  # only latent thinking replaces input embeddings
        self.hidden: Tensor | None = None
        self.prompt_width = 0  # keys of the prompt forward (the padded prompt), read by the pattern hooks

    def hooks(self, model) -> list[Hook]:
        """The hooks to attach: ``hook_embed`` (latent inputs), attention patterns, final hidden state."""
        hooks: list[Hook] = [("hook_embed", self._embed_hook)] if self.latent else []
        if self.attn is not None:
            hooks += [(pattern_hook_name(layer), self._pattern_hook(i)) for i, layer in enumerate(self.layers)]
        if self.want_hidden:
            hooks.append((self.want_hidden, self._hidden_hook))
        return hooks

    def end_rows(self, step: int, ended: Tensor) -> None:
        """Mark the attention of rows that are no longer live at ``step`` as NaN."""
        if self.attn is not None:
            self.attn[step, :, ended] = float("nan")

    def _pattern_hook(self, index: int):
        def record(pattern: Tensor, hook) -> None:
            last = pattern[:, :, -1, :]  # newest query: [row, head, key]
            assert self.masks is not None and self.attn is not None  # hooks() attaches this only then
            if self.step == 0:  # the prompt forward: every layer's keys are the padded prompt
                self.prompt_width = last.shape[-1]
            seen = self.prompt_width + self.step  # positions the newest query can see
            # a sliding-window layer's cache (Gemma) keeps the window's last keys only: its pattern covers those
            keys = self.masks[:, seen - last.shape[-1]: seen]
            with one_thread():  # one tiny matmul: waking more threads costs more than it
                torch.matmul(last.float(), keys, out=self.attn[self.step, index])

        return record

    def _hidden_hook(self, x: Tensor, hook) -> None:
        self.hidden = x[:, -1].detach().clone()

    def _embed_hook(self, x: Tensor, hook):
        """Latent thinking inputs: the step context's ``inputs`` at the newest position."""
        ctx = hook.step
        if ctx is None or ctx.inputs is None:
            return None
        rows, vectors = ctx.inputs
        x = x.clone()
        x[rows, -1] = vectors.to(x.dtype)
        return x
