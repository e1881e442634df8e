"""The model's facts, read once per run: what the pipeline needs to know about a model besides running it.

An evaluation or a generation asks the same questions of the model at every level: its tokenizer, its
context length, its vocabulary size, the ids that end a generation, the device of its weights, its name and
what architecture it is (the ARM presets are chosen by it). :func:`model_facts` reads them once, from
``model.cfg``, ``model.tokenizer`` and the wrapped Hugging Face model, into a frozen :class:`ModelFacts` that
:func:`lensprobe.evaluate` computes at its start and passes down (to the planning of rows, to
:func:`lensprobe.generate`, to the ARM preset), so no level below reads them through the model again.

The weights' digest and the engine are the run identity's concern; :class:`ModelFacts` has a field for each
(``None`` until the caller that computes them fills them in with ``dataclasses.replace``).

Example:
    >>> from lensprobe.core.models.facts import model_facts
    >>> from lensprobe.core.models.testing import tiny_model
    >>> facts = model_facts(tiny_model())
    >>> facts.n_ctx, facts.d_vocab, facts.end_ids
    (256, 400, (2,))
    >>> facts.architecture.family, facts.architecture.n_layers
    ('llama', 2)
"""

from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from lensprobe.core.models.devices import model_device, model_dtype
from lensprobe.core.models.loading import model_label
from lensprobe.core.version import __version__

__all__ = ["Architecture", "ModelFacts", "architecture", "end_ids", "model_facts", "pad_id", "run_environment"]


@dataclass(frozen=True)
class Architecture:
    """What a model is, by its configuration (not its name): the key the ARM presets are looked up by.

    Attributes:
        family: the Hugging Face ``model_type`` (``"qwen2"``, ``"llama"``, ``"gemma3"``; a multimodal model's
            text configuration's, without ``"_text"``), or ``None`` when the model has no Hugging Face
            configuration (a ``HookedTransformer``).
        n_layers, n_heads, n_kv_heads, d_model, d_mlp, d_vocab: the dimensions (``n_kv_heads``: key-value
            heads, ``n_heads`` without grouped-query attention; ``d_mlp``: the MLP's hidden width).
        rope_theta: the rotary embedding's base, or ``None`` without rotary embeddings.
        max_positions: the Hugging Face configuration's ``max_position_embeddings`` (TransformerLens may cap
            ``n_ctx`` below it), or ``None`` when unknown.
    """

    family: str | None
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_mlp: int | None
    d_vocab: int
    rope_theta: float | None
    max_positions: int | None


@dataclass(frozen=True, eq=False)
class ModelFacts:
    """A model's facts, read once (:func:`model_facts`) and passed down instead of the model being asked again.

    Attributes:
        name: a short readable name (:func:`~lensprobe.core.models.loading.model_label`).
        tokenizer: the model's tokenizer.
        n_ctx: the context length in tokens (``model.cfg.n_ctx``).
        d_vocab: the vocabulary size (rows of the unembedding).
        n_layers, n_heads: layers and query heads per layer.
        end_ids: the ids that end a generation: the tokenizer's EOS and the generation config's, sorted.
        pad_id: the id fed at padded positions (masked): the tokenizer's pad token, else its EOS, else 0.
        device, dtype: where the weights are and their floating dtype.
        prepend_bos: whether the model puts its BOS token in front of a plain prompt
            (``cfg.default_prepend_bos``).
        architecture: what the model is by configuration (:class:`Architecture`).
        weights_digest: the digest of the weights, when the run's identity has computed it (else ``None``).
        engine: the engine that runs the forwards, when chosen (else ``None``).
    """

    name: str
    tokenizer: Any = field(repr=False)
    n_ctx: int
    d_vocab: int
    n_layers: int
    n_heads: int
    end_ids: tuple[int, ...]
    pad_id: int
    device: torch.device
    dtype: torch.dtype
    prepend_bos: bool
    architecture: Architecture
    weights_digest: str | None = None
    engine: str | None = None


def model_facts(model) -> ModelFacts:
    """Read a TransformerLens model's facts once (see :class:`ModelFacts`).

    Args:
        model: a ``TransformerBridge``, a ``HookedTransformer`` or a look-alike with ``cfg`` and ``tokenizer``.

    Example:
        >>> model_facts(tiny_model()).pad_id
        0
    """
    cfg, tokenizer = model.cfg, getattr(model, "tokenizer", None)
    hf = getattr(model, "original_model", None)
    return ModelFacts(
        name=model_label(model), tokenizer=tokenizer, n_ctx=int(cfg.n_ctx), d_vocab=int(cfg.d_vocab),
        n_layers=int(cfg.n_layers), n_heads=int(cfg.n_heads),
        end_ids=end_ids(tokenizer, getattr(hf, "generation_config", None)), pad_id=pad_id(tokenizer),
        device=model_device(model), dtype=model_dtype(model),
        prepend_bos=bool(getattr(cfg, "default_prepend_bos", True)), architecture=architecture(model),
    )


def end_ids(tokenizer, generation_config: Any = None) -> tuple[int, ...]:
    """End-of-sequence ids, sorted: the tokenizer's and a Hugging Face generation config's (an id or a list).

    Example:
        >>> end_ids(None, type("G", (), {"eos_token_id": [7, 3]})())
        (3, 7)
    """
    ids = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    return tuple(sorted(ids))


def pad_id(tokenizer) -> int:
    """The id fed as padding (its positions are masked): the tokenizer's pad or EOS token, else 0.

    Example:
        >>> pad_id(None)
        0
    """
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def architecture(model) -> Architecture:
    """What ``model`` is by configuration: dimensions from ``model.cfg``, the family and position limit from the
    wrapped Hugging Face model's configuration (a multimodal model's text configuration).

    Example:
        >>> architecture(tiny_model()).d_mlp
        128
    """
    cfg = model.cfg
    config = getattr(getattr(model, "original_model", None), "config", None)
    config = getattr(config, "text_config", None) or config
    family = getattr(config, "model_type", None)
    n_heads = int(cfg.n_heads)
    d_mlp = getattr(cfg, "d_mlp", None)
    rope = getattr(cfg, "rotary_base", None) if getattr(cfg, "positional_embedding_type", "rotary") == "rotary" else None
    max_positions = getattr(config, "max_position_embeddings", None)
    return Architecture(
        family=str(family).removesuffix("_text") if family else None, n_layers=int(cfg.n_layers), n_heads=n_heads,
        n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or n_heads), d_model=int(cfg.d_model),
        d_mlp=int(d_mlp) if d_mlp is not None else None, d_vocab=int(cfg.d_vocab),
        rope_theta=float(rope) if rope is not None else None,
        max_positions=int(max_positions) if max_positions is not None else None,
    )


ENVIRONMENT_PACKAGES = ("lensprobe", "torch", "transformers", "transformer_lens")
"""The packages whose versions every evaluation row records (``versions``)."""


def run_environment(model) -> dict[str, str]:
    """What every evaluation row records of where it ran: the versions of :data:`ENVIRONMENT_PACKAGES`
    (``"name version"``, comma separated; ``"name not installed"`` when one is missing), the device and the
    floating dtype of the model's weights, as they are when the row is made (so a table reads them from the
    rows, not from the machine that writes it).

    Example:
        >>> run_environment(tiny_model())["dtype"]
        'float32'
    """
    found = []
    for name in ENVIRONMENT_PACKAGES:
        try:
            version = __version__ if name == "lensprobe" else metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "not installed"
        found.append(f"{name} {version}")
    return {"versions": ", ".join(found), "device": str(model_device(model)),
            "dtype": str(model_dtype(model)).removeprefix("torch.")}
