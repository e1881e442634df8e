"""Tiny random-weight models of the meaningless-tokens paper's model families, as Hugging Face folders.

The paper (arXiv 2510.01032) runs Qwen2.5 (``Qwen2ForCausalLM``: biases on q/k/v), Llama-3.1
(``LlamaForCausalLM`` with ``llama3`` rope scaling) and Gemma 3 (sliding-window and global layers,
q/k norms; gemma-3-4b-it and 27b-it are ``Gemma3ForConditionalGeneration``, a text model behind a
vision tower). :func:`tiny_family_folder` writes a seeded model of each, small enough for the
fast tests, as a folder that ``lp.load_model(folder)`` and plain ``transformers`` both load: its
config, weights, generation config and tokenizer. The tokenizer is a tiny byte-level BPE (as in
:func:`lensprobe.core.models.testing.tiny_tokenizer`) with the family's special tokens, its BOS
rule (Llama and Gemma prepend one, Qwen does not) and the real model's chat template
(:mod:`lensprobe.core.models.chat_templates`). Nothing is downloaded.

Example:
    >>> folder = tiny_family_folder("gemma3", tmp_path / "gemma3")
    >>> model = lp.load_model(folder)
    >>> FAMILIES
    ('qwen2', 'llama3', 'gemma3', 'gemma3-vision')
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy
from lensprobe.core.models.chat_templates import GEMMA3_TEMPLATE, LLAMA31_TEMPLATE, QWEN25_TEMPLATE
from lensprobe.core.models.loading import quiet
from lensprobe.core.models.testing import CORPUS

__all__ = ["FAMILIES", "Family", "family", "tiny_family_folder", "tiny_family_tokenizer"]


@dataclass(frozen=True)
class Family:
    """One model family: what its tiny model is built from.

    Attributes:
        name: the family's key in :data:`FAMILIES`.
        architecture: the ``transformers`` class of the paper's models.
        paper_model: a paper model of the family (its ARM preset and chat template).
        specials: the tokenizer's special tokens, in id order.
        bos, eos, pad: the tokenizer's BOS (``None``: none, and none is prepended), EOS and padding tokens.
        stops: the tokens that end generation (the real generation config's ``eos_token_id``).
        template: the chat template.
        sampling: the real generation config's sampling fields.
    """

    name: str
    architecture: str
    paper_model: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str | None
    stops: tuple[str, ...]
    template: str
    sampling: dict[str, Any] = field(default_factory=dict)


_QWEN = Family(  # Qwen/Qwen2.5-7B-Instruct: tokenizer_config.json, generation_config.json
    "qwen2", "Qwen2ForCausalLM", "Qwen/Qwen2.5-7B-Instruct", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    bos=None, eos="<|im_end|>", pad="<|endoftext|>", stops=("<|im_end|>", "<|endoftext|>"), template=QWEN25_TEMPLATE,
    sampling={"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
)
_LLAMA = Family(  # meta-llama/Llama-3.1-8B-Instruct: tokenizer_config.json, generation_config.json (no pad token)
    "llama3", "LlamaForCausalLM", "meta-llama/Llama-3.1-8B-Instruct",
    ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
     "<|python_tag|>"),
    bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, stops=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    template=LLAMA31_TEMPLATE, sampling={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
)
_GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                   "<end_of_image>", "<image_soft_token>")
_GEMMA = Family(  # google/gemma-3-4b-it: tokenizer_config.json, generation_config.json
    "gemma3", "Gemma3ForCausalLM", "google/gemma-3-4b-it", _GEMMA_SPECIALS, bos="<bos>", eos="<eos>", pad="<pad>",
    stops=("<eos>", "<end_of_turn>"), template=GEMMA3_TEMPLATE, sampling={"do_sample": True, "top_k": 64, "top_p": 0.95},
)
_GEMMA_VISION = Family(
    "gemma3-vision", "Gemma3ForConditionalGeneration", "google/gemma-3-27b-it", _GEMMA_SPECIALS, bos="<bos>",
    eos="<eos>", pad="<pad>", stops=("<eos>", "<end_of_turn>"), template=GEMMA3_TEMPLATE,
    sampling={"do_sample": True, "top_k": 64, "top_p": 0.95},
)
_FAMILIES = {f.name: f for f in (_QWEN, _LLAMA, _GEMMA, _GEMMA_VISION)}
FAMILIES = tuple(_FAMILIES)
"""The families: ``"qwen2"``, ``"llama3"``, ``"gemma3"`` (text) and ``"gemma3-vision"``."""


def family(name: str) -> Family:
    """The :class:`Family` called ``name``.

    Raises:
        LensprobeError: an unknown name.

    Example:
        >>> family("llama3").architecture
        'LlamaForCausalLM'
    """
    if name not in _FAMILIES:
        raise LensprobeError(f"unknown model family {name!r}: use one of {FAMILIES}.")
    return _FAMILIES[name]


def tiny_family_tokenizer(name: str):
    """A byte-level BPE tokenizer (a few hundred tokens) with the family's special tokens, BOS rule and
    chat template, as a ``PreTrainedTokenizerFast``.

    Example:
        >>> tok = tiny_family_tokenizer("llama3")
        >>> tok("hi").input_ids[0] == tok.bos_token_id
        True
    """
    fam = family(name)
    tk, transformers = heavy("tokenizers"), heavy("transformers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=400, special_tokens=list(fam.specials), show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    if fam.bos is not None:  # the real tokenizer's post-processor: BOS before every text
        bos_id = tok.token_to_id(fam.bos)
        tok.post_processor = tk.processors.TemplateProcessing(
            single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B", special_tokens=[(fam.bos, bos_id)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=fam.bos, eos_token=fam.eos,
                                                pad_token=fam.pad)
    fast.chat_template = fam.template
    return fast


def _config(fam: Family, tok, n_layers: int):
    """The family's ``transformers`` config at test size: width 64, 4 query heads sharing 2 KV heads, the
    family's own features (Gemma: head size 16, a window of 6, the 4b model's rope per layer type)."""
    transformers = heavy("transformers")
    ids = {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "pad_token_id": tok.pad_token_id,
           "eos_token_id": tok.convert_tokens_to_ids(list(fam.stops))}
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    if fam.name == "qwen2":
        return transformers.Qwen2Config(**ids, **shape, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if fam.name == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # 8192 in the real model
        return transformers.LlamaConfig(**ids, **shape, rope_parameters=rope)
    layer_types = ["sliding_attention", "full_attention"] * (n_layers // 2) + ["sliding_attention"] * (n_layers % 2)
    text = transformers.Gemma3TextConfig(
        **ids, **{**shape, "tie_word_embeddings": True}, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
        layer_types=layer_types, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})
    if fam.name == "gemma3":
        return text
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    image = {key: tok.convert_tokens_to_ids(token) for key, token in (
        ("boi_token_index", "<start_of_image>"), ("eoi_token_index", "<end_of_image>"),
        ("image_token_index", "<image_soft_token>"))}
    return transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision, mm_tokens_per_image=4,
                                     tie_word_embeddings=True, **image, **{k: v for k, v in ids.items() if k != "vocab_size"})


def tiny_family_folder(name: str, path: str | Path, seed: int = 0, *, n_layers: int = 2) -> Path:
    """Write a seeded tiny random model of family ``name`` as a Hugging Face folder at ``path``.

    Args:
        name: one of :data:`FAMILIES`.
        path: the folder to write (created; files in it are replaced).
        seed: weights are drawn under ``torch.manual_seed(seed)``: the same seed, the same weights.
        n_layers: decoder layers (Gemma alternates sliding-window and global layers, starting with one
            sliding-window layer).

    Returns:
        ``path``, holding ``config.json``, the safetensors weights, ``generation_config.json`` (the
        family's stop tokens and sampling fields) and the tokenizer with its chat template.

    Example:
        >>> folder = tiny_family_folder("qwen2", tmp_path / "qwen2", seed=1)
        >>> (folder / "config.json").is_file()
        True
    """
    fam = family(name)
    transformers = heavy("transformers")
    tok = tiny_family_tokenizer(name)
    config = _config(fam, tok, n_layers)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, fam.architecture)(config).eval()
    gen = {"bos_token_id": config.bos_token_id, "pad_token_id": config.pad_token_id,
           "eos_token_id": tok.convert_tokens_to_ids(list(fam.stops)), **fam.sampling}
    model.generation_config = transformers.GenerationConfig(**gen)
    folder = Path(path)
    with quiet():
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder
