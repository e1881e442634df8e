"""A tiny, seeded, random Llama model with grouped-query attention, for fast tests.

It is a real Hugging Face ``LlamaForCausalLM`` (so the KV cache and eager attention are
the same code as in large models) wrapped in a TransformerLens ``TransformerBridge``,
with a small byte-level BPE tokenizer trained on the spot and a ChatML chat template.
:func:`tiny_hooked_model` holds the same weights in a TransformerLens 3.x
``HookedTransformer`` (TransformerLens' own modules), with the same tokenizer.
Nothing is downloaded. tokenizers, transformers and transformer_lens are imported on first
use (:func:`lensprobe.core.lazy.heavy`), so the command line starts fast.
"""

import atexit
import functools
import shutil
import tempfile

import torch

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import heavy
from lensprobe.core.models.kinds import HOOKED_INSTALL, hooked_transformer_class
from lensprobe.core.models.loading import quiet

__all__ = ["CHATML_TEMPLATE", "tiny_hf_model", "tiny_hooked_model", "tiny_model", "tiny_tokenizer"]

CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "What is 12+7? The answer is 19. What is 3*4? It is 12.",
    "/ / / / / / / / he he he he the cat sat on the mat # * # * ## ** ###",
    "The quick brown fox jumps over the lazy dog. A random sentence of real words.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) { } [ ] \\frac \\sqrt x y z",
    "system user assistant question answer filler thinking <thinking> tokens",
]


@functools.cache
def tiny_tokenizer(chat_template: bool = True):
    """A byte-level BPE tokenizer (vocabulary of a few hundred) with ChatML special tokens."""
    tk, transformers = heavy("tokenizers"), heavy("transformers")
    decoders, pre_tokenizers, trainers = tk.decoders, tk.pre_tokenizers, tk.trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    # TransformerLens reloads the tokenizer by its name_or_path, so give it a real folder.
    folder = tempfile.mkdtemp(prefix="lensprobe-tiny-tokenizer-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    try:
        fast.save_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception for OS errors
        raise LensprobeError(f"cannot write the tiny test model's tokenizer to {folder} ({err}): free disk space in "
                             "the temporary folder (TMPDIR) or raise the file-size limit (ulimit -f).") from None
    return transformers.AutoTokenizer.from_pretrained(folder)


def tiny_hf_model(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
                  d_model: int = 64, n_ctx: int = 256, chat_template: bool = True):
    """The plain Hugging Face ``LlamaForCausalLM`` behind :func:`tiny_model`, and its tokenizer.

    Same arguments, same seed -> the same weights as ``tiny_model``; the model is not
    wrapped, so ``output_attentions=True`` works on it (useful as an independent oracle).

    Example:
        >>> hf, tok = tiny_hf_model(seed=0)
        >>> hf.config.num_key_value_heads
        2
    """
    transformers = heavy("transformers")
    tok = tiny_tokenizer(chat_template)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=d_model, intermediate_size=2 * d_model,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
        max_position_embeddings=n_ctx, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf = transformers.LlamaForCausalLM(config).eval()
    return hf, tok


def tiny_model(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
               d_model: int = 64, n_ctx: int = 256, chat_template: bool = True):
    """A seeded random ``LlamaForCausalLM`` with grouped-query attention, as a bridge.

    Args:
        seed: weights are drawn with ``torch.manual_seed(seed)``; the same seed gives the
            same model.
        n_layers, n_heads, n_kv_heads, d_model, n_ctx: the architecture (default: 2 layers,
            4 query heads sharing 2 KV heads, width 64, context 256).
        chat_template: give the tokenizer a ChatML template (``False`` for a tokenizer
            without one).

    Example:
        >>> from lensprobe.core.models.testing import tiny_model
        >>> model = tiny_model()
        >>> model.cfg.n_heads, model.cfg.n_layers
        (4, 2)
    """
    TransformerBridge = heavy("transformer_lens.model_bridge").TransformerBridge
    hf, tok = tiny_hf_model(seed, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                            d_model=d_model, n_ctx=n_ctx, chat_template=chat_template)
    with quiet():
        return TransformerBridge.boot_transformers(
            "lensprobe-tiny-llama", hf_model=hf, tokenizer=tok, n_ctx=n_ctx
        )


def tiny_hooked_model(seed: int = 0, *, n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
                      d_model: int = 64, n_ctx: int = 256, chat_template: bool = True):
    """The model of :func:`tiny_model` as a TransformerLens 3.x ``HookedTransformer``.

    Same arguments and seed -> the same weights as ``tiny_hf_model(seed)`` (converted with
    TransformerLens' own Llama weight converter, nothing folded or centred) and the same
    tokenizer: grouped-query attention, a gated SiLU MLP, RMSNorm and rotary embeddings. So
    the plain Hugging Face model from :func:`tiny_hf_model` is an independent oracle for it.

    Raises:
        LensprobeError: the installed TransformerLens has no ``HookedTransformer`` (4.x).

    Example:
        >>> from lensprobe.core.models.testing import tiny_hooked_model
        >>> model = tiny_hooked_model()
        >>> model.cfg.n_key_value_heads, model.cfg.gated_mlp
        (2, True)
    """
    HookedTransformer = hooked_transformer_class()
    if HookedTransformer is None:
        raise LensprobeError(
            "tiny_hooked_model needs TransformerLens 3.x, whose HookedTransformer was removed in 4.0: "
            f"install it with `{HOOKED_INSTALL}` (or run `make test-tl3`)."
        )
    tl = heavy("transformer_lens")
    convert = heavy("transformer_lens.pretrained.weight_conversions").convert_llama_weights
    hf, tok = tiny_hf_model(seed, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                            d_model=d_model, n_ctx=n_ctx, chat_template=chat_template)
    c = hf.config
    d_head = c.hidden_size // c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
    cfg = tl.HookedTransformerConfig(
        model_name="lensprobe-tiny-llama", original_architecture="LlamaForCausalLM",
        d_model=c.hidden_size, d_head=d_head, n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps, d_vocab=c.vocab_size,
        act_fn=c.hidden_act, n_key_value_heads=c.num_key_value_heads, normalization_type="RMS", final_rms=True,
        positional_embedding_type="rotary", rotary_adjacent_pairs=False, rotary_dim=d_head,
        rotary_base=float(rope["rope_theta"]), gated_mlp=True, device="cpu", dtype=torch.float32,
    )
    with quiet():  # TransformerLens 3.x warns that HookedTransformer is deprecated
        model = HookedTransformer(cfg, tokenizer=tok)
        model.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False,
                                          center_unembed=False, fold_value_biases=False)
    return model.eval()
