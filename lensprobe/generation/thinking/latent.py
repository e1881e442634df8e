"""Latent thinking tokens: what goes in at a thinking position (LT-Tuning, Coconut, Soft-Thinking, pause).

At a thinking step (see :mod:`lensprobe.generation.thinking.schedule` for *when*), the token recorded for the
step is the thinking token (e.g. ``<thinking>``), and the input embedding at the new
position is replaced:

- :class:`LatentFusion` (LT-Tuning, arXiv 2602.10229):
  ``alpha * h + (1 - alpha) * sum_w p~(w) E(w)``, where ``h`` is the final hidden state
  (after the final norm) at the position that predicted the thinking step, ``p~`` the
  softmax of ``logits / temperature`` with the thinking token masked out, kept to the
  top-p nucleus and renormalised, and ``E`` the input embedding matrix. ``alpha = 1`` is
  Coconut (the raw hidden state), ``alpha = 0`` is Soft-Thinking (the probability-weighted
  embedding).
- :class:`Pause`: the thinking token's own embedding (the paper's "w/o Latent (Pause)"
  baseline).

The replacement is made at ``hook_embed`` for the new position only, so it is exactly what
a ``transformers`` loop passing ``inputs_embeds`` computes, and it stays correct under the
KV cache (the cache holds the keys and values computed from the latent input).

Example:
    >>> import lensprobe as lp
    >>> tid = lp.generation.add_thinking_token(model, "<thinking>")
    >>> trace = lp.trace_generation(model, prompt, max_new_tokens=64,
    ...                             thinking=lp.generation.LatentFusion(alpha=0.6, top_p=0.9),
    ...                             think_when=lp.generation.schedule.every(8))
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float
from tokenizers import AddedToken
from torch import Tensor

from lensprobe.core.checks import check_annotated
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.kinds import is_hooked_transformer

__all__ = [
    "THINKING_TOKEN",
    "LatentFusion",
    "Pause",
    "add_thinking_token",
    "latent_fusion_vector",
    "nucleus_probs",
    "thinking_token_id",
]

THINKING_TOKEN = "<thinking>"
"""The default thinking token string."""


@dataclass(frozen=True)
class LatentFusion:
    """Latent thinking input ``alpha * h + (1 - alpha) * sum_w p~(w) E(w)`` (LT-Tuning).

    Args:
        alpha: weight of the hidden state in ``[0, 1]``; 0.6 in the paper. ``1`` is Coconut,
            ``0`` is Soft-Thinking.
        top_p: nucleus of the probability-weighted embedding, in ``(0, 1]``.
        temperature: softmax temperature of ``p~`` (> 0).
        token: the thinking token string (must be one token of the vocabulary; add it with
            :func:`add_thinking_token`).

    Example:
        >>> lp.generation.LatentFusion(alpha=0.6, top_p=0.9)
        >>> lp.generation.LatentFusion.coconut(), lp.generation.LatentFusion.soft_thinking()
    """

    alpha: float = 0.6
    top_p: float = 0.9
    temperature: float = 1.0
    token: str = THINKING_TOKEN

    def __post_init__(self):
        check_annotated(self)
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not 0.0 <= self.alpha <= 1.0:
            raise LensprobeError(f"LatentFusion alpha must lie in [0, 1], got {self.alpha!r} "
                                 "(1 = Coconut, 0 = Soft-Thinking).")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0.0 < self.top_p <= 1.0:
            raise LensprobeError(f"LatentFusion top_p must lie in (0, 1], got {self.top_p!r}.")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) or self.temperature <= 0:
            raise LensprobeError(f"LatentFusion temperature must be > 0, got {self.temperature!r}.")
        _check_token_str(self.token)

    @classmethod
    def coconut(cls, token: str = THINKING_TOKEN) -> "LatentFusion":
        """Coconut: the raw final hidden state (``alpha = 1``)."""
        return cls(alpha=1.0, token=token)

    @classmethod
    def soft_thinking(cls, top_p: float = 0.9, temperature: float = 1.0,
                      token: str = THINKING_TOKEN) -> "LatentFusion":
        """Soft-Thinking: the probability-weighted embedding (``alpha = 0``)."""
        return cls(alpha=0.0, top_p=top_p, temperature=temperature, token=token)

    @property
    def label(self) -> str:
        if self.alpha == 1.0:
            return "Coconut (alpha=1)"
        if self.alpha == 0.0:
            return f"Soft-Thinking (alpha=0, top_p={self.top_p:g})"
        return f"LatentFusion (alpha={self.alpha:g}, top_p={self.top_p:g})"

    def input_vectors(self, model, hidden: Float[Tensor, "batch d_model"],
                      logits: Float[Tensor, "batch d_vocab"], token_id: int) -> Float[Tensor, "batch d_model"]:
        """The latent inputs for the rows that think (``hidden``/``logits`` of those rows)."""
        return latent_fusion_vector(hidden, logits, model.W_E, alpha=self.alpha, top_p=self.top_p,
                                    temperature=self.temperature, exclude_token=token_id)


@dataclass(frozen=True)
class Pause:
    """Pause-token baseline: the thinking token's own input embedding goes in.

    Args:
        token: the thinking token string (one token of the vocabulary).

    Example:
        >>> lp.trace_generation(model, p, max_new_tokens=64, thinking=lp.generation.Pause(),
        ...                     think_when=lp.generation.schedule.every(8))
    """

    token: str = THINKING_TOKEN

    def __post_init__(self):
        check_annotated(self)
        _check_token_str(self.token)

    @property
    def label(self) -> str:
        return "Pause"

    def input_vectors(self, model, hidden, logits, token_id: int):
        """``None``: the token's own embedding is used, no replacement."""
        return None


def _check_token_str(token) -> None:
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        raise LensprobeError(
            f"thinking token must be a non-empty string without whitespace such as '<thinking>', got {token!r}."
        )


def nucleus_probs(logits: Float[Tensor, "... d_vocab"], *, top_p: float = 1.0, temperature: float = 1.0,
                  exclude_token: int | None = None) -> Float[Tensor, "... d_vocab"]:
    """Softmax of ``logits / temperature``, optionally without one token, cut to the top-p nucleus.

    The nucleus is the smallest set of most probable tokens whose mass reaches ``top_p``
    (the token that crosses ``top_p`` is kept); the result is renormalised to sum to 1.

    Example:
        >>> nucleus_probs(torch.tensor([2.0, 1.0, 0.0]), top_p=0.5)
        tensor([1., 0., 0.])
    """
    z = logits.float() / temperature
    if exclude_token is not None:
        z = z.clone()
        z[..., exclude_token] = float("-inf")
    probs = torch.softmax(z, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of strictly more probable tokens
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def latent_fusion_vector(hidden: Float[Tensor, "batch d_model"], logits: Float[Tensor, "batch d_vocab"],
                         embedding: Float[Tensor, "d_vocab d_model"], *, alpha: float, top_p: float = 0.9,
                         temperature: float = 1.0, exclude_token: int | None = None
                         ) -> Float[Tensor, "batch d_model"]:
    """``alpha * hidden + (1 - alpha) * p~ @ embedding`` (LT-Tuning's latent input).

    Args:
        hidden: final hidden states (after the final norm) at the predicting positions.
        logits: next-token logits at those positions.
        embedding: the input embedding matrix ``E`` (``model.W_E``).
        alpha: weight of ``hidden``.
        top_p, temperature, exclude_token: see :func:`nucleus_probs`.

    Example:
        >>> v = latent_fusion_vector(h, logits, model.W_E, alpha=0.6, top_p=0.9, exclude_token=tid)
    """
    if embedding.shape[0] != logits.shape[-1]:
        raise LensprobeError(
            f"embedding has {embedding.shape[0]} rows but the logits cover {logits.shape[-1]} tokens; "
            "if you added a token, add it to both the input embedding and the output layer "
            "(lp.generation.add_thinking_token does)."
        )
    out = alpha * hidden.float()
    if alpha < 1.0:
        p = nucleus_probs(logits, top_p=top_p, temperature=temperature, exclude_token=exclude_token)
        out = out + (1.0 - alpha) * (p @ embedding.float())
    return out.to(embedding.dtype)


def thinking_token_id(model, token: str) -> int:
    """Id of ``token`` if the vocabulary holds it as one token, else a clear error. ``model``: a model or its
    :class:`~lensprobe.core.models.facts.ModelFacts` (only its ``tokenizer`` is read)."""
    tok = model.tokenizer
    if tok is None:
        raise LensprobeError(
            f"thinking tokens need a tokenizer to find {token!r}, and this model has none: attach one "
            "(model.set_tokenizer(...)) or generate without thinking."
        )
    ids = tok.encode(token, add_special_tokens=False)
    if len(ids) == 1 and tok.decode(ids) == token:
        return int(ids[0])
    raise LensprobeError(
        f"{token!r} is not a single token of this model's vocabulary (it encodes as {len(ids)} "
        f"tokens); add it first with lp.generation.add_thinking_token(model, {token!r})."
    )


def add_thinking_token(model, token: str = THINKING_TOKEN) -> int:
    """Add a thinking token to the vocabulary if it lacks it, and return its id.

    The token is added to the tokenizer as a special token (never split, never merged),
    and one row is appended to the input embedding, initialised to the **mean of the
    existing input embeddings**; with untied weights, one row initialised to the mean
    output row is appended to the output layer too (tied weights grow together). So an
    untrained model sees the thinking token as an "average" token. If the token already
    is one token of the vocabulary, nothing changes. A TransformerLens 3.x
    ``HookedTransformer`` grows the same way: a mean row in ``W_E``, a mean column in
    ``W_U`` and the mean of ``b_U``.

    This changes the model in place (its vocabulary grows by one); call it on a copy
    (``copy.deepcopy(model)``) if other code shares the model.

    Args:
        model: a ``TransformerBridge`` over a Hugging Face model, or a ``HookedTransformer``.
        token: the token string, e.g. ``"<thinking>"`` (no whitespace).

    Returns:
        The token id.

    Raises:
        LensprobeError: the string contains whitespace, or it already reads as several
            tokens of the vocabulary's special/added tokens (e.g. ``"<|im_start|><|im_end|>"``),
            so it cannot become one token.

    Example:
        >>> tid = lp.generation.add_thinking_token(model, "<thinking>")
        >>> model.to_str_tokens(lp.build_prompt(model, "hi").tokens)  # unchanged prompts
    """
    _check_token_str(token)
    tok = model.tokenizer
    ids = tok.encode(token, add_special_tokens=False)
    if len(ids) == 1 and tok.decode(ids) == token:
        return int(ids[0])
    hf = _check_can_add(model, token, ids)
    old_vocab = _embedding_rows(model, hf)
    tok.add_tokens([AddedToken(token, special=True, normalized=False)], special_tokens=True)
    new_id = tok.convert_tokens_to_ids(token)
    if new_id != old_vocab:  # pragma: no cover - tokenizer-specific
        raise LensprobeError(f"the tokenizer gave the new token id {new_id}, expected {old_vocab}.")
    if hf is None:
        _append_mean_rows_hooked(model)
    else:
        _append_mean_rows(hf)
    _set_vocab_size(model, hf, old_vocab + 1)
    return int(new_id)


def _check_can_add(model, token: str, ids: list[int]):
    """The Hugging Face model to grow (``None`` for a HookedTransformer), or a clear error why
    ``token`` cannot be added."""
    tok = model.tokenizer
    added = set(getattr(tok, "all_special_ids", [])) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    if len(ids) > 1 and all(i in added for i in ids):
        pieces = tok.convert_ids_to_tokens(ids)
        raise LensprobeError(
            f"{token!r} is already several tokens of the vocabulary ({pieces}); a thinking token "
            "must be one token: pass one string such as '<thinking>'."
        )
    if is_hooked_transformer(model):
        hf = None
    else:
        hf = getattr(model, "original_model", None)
        if hf is None or not hasattr(hf, "get_input_embeddings"):
            raise LensprobeError(
                "add_thinking_token needs a TransformerLens TransformerBridge over a Hugging Face "
                "model (lp.load_model() returns one) or a HookedTransformer."
            )
    rows = _embedding_rows(model, hf)
    if len(tok) != rows:
        raise LensprobeError(
            f"the tokenizer has {len(tok)} tokens but the embedding has {rows} rows; "
            "add_thinking_token only grows a model whose tokenizer and embedding match."
        )
    return hf


def _append_mean_rows(hf) -> None:
    """Append the mean row to the input embedding (and to an untied output layer and its bias)."""
    emb = _base_module(hf.get_input_embeddings())
    out = _base_module(hf.get_output_embeddings()) if hf.get_output_embeddings() is not None else None
    tied = out is not None and out.weight is emb.weight
    with torch.no_grad():
        w = emb.weight
        w.data = torch.cat([w.data, w.data.mean(0, keepdim=True)])
        emb.num_embeddings = w.shape[0]
        if out is not None:
            if not tied:
                u = out.weight
                u.data = torch.cat([u.data, u.data.mean(0, keepdim=True)])
            if getattr(out, "bias", None) is not None:
                out.bias.data = torch.cat([out.bias.data, out.bias.data.mean().reshape(1)])
            out.out_features = out.weight.shape[0]


def _embedding_rows(model, hf) -> int:
    """Rows of the input embedding: the Hugging Face model's, or a HookedTransformer's ``W_E``."""
    return int((model.embed.W_E if hf is None else _base_module(hf.get_input_embeddings()).weight).shape[0])


def _append_mean_rows_hooked(model) -> None:
    """Append the mean row to a HookedTransformer's ``W_E``, the mean column to ``W_U`` and the mean to ``b_U``."""
    with torch.no_grad():
        for param, dim in ((model.embed.W_E, 0), (model.unembed.W_U, 1)):
            param.data = torch.cat([param.data, param.data.mean(dim, keepdim=True)], dim)
        bias = getattr(model.unembed, "b_U", None)
        if bias is not None:
            bias.data = torch.cat([bias.data, bias.data.mean().reshape(1)])


def _set_vocab_size(model, hf, new_vocab: int) -> None:
    for name in ("d_vocab", "d_vocab_out"):
        if hasattr(model.cfg, name):
            setattr(model.cfg, name, new_vocab)
    if hf is None:
        return
    hf.config.vocab_size = new_vocab
    text_config = getattr(hf.config, "text_config", None)
    if text_config is not None and hasattr(text_config, "vocab_size"):
        text_config.vocab_size = new_vocab


def _base_module(module):
    """The plain torch module under a TransformerLens bridge component."""
    return getattr(module, "original_component", module)
