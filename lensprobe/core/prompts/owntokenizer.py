"""A model's tokenizer as ``AutoTokenizer.from_pretrained(name)`` loads it: the one the meaningless-tokens
authors call and lm-eval's ``hf`` model loads.

TransformerLens replaces a model's tokenizer by one reloaded with ``add_bos_token=True`` when the tokenizer
defines a BOS token but does not add it itself (SmolLM2: ``<|im_start|>``), so ``model.tokenizer(text)``
starts with a BOS token that ``AutoTokenizer.from_pretrained(name)(text)`` does not have: one token more
on every prompt. :func:`own_tokenizer` gives the tokenizer as it loads on its own (reloaded from its
``name_or_path`` without that argument, once per tokenizer object), so the paper format's token ids
(:func:`~lensprobe.core.prompts.prompt.build_prompt`'s ``template="raw"``) and lm-eval's requests
(:class:`lensprobe.evals.lmeval.LensprobeLM`) hold exactly the special tokens the tokenizer adds by itself:
Llama-3.1's and Gemma-3's BOS, none for SmolLM2 or Qwen2.5.

Example:
    >>> model = lp.load_model()                      # SmolLM2: TransformerLens's tokenizer prepends BOS
    >>> text = "Please reason step by step."
    >>> len(model.tokenizer(text).input_ids) - len(own_tokenizer(model.tokenizer)(text).input_ids)
    1
    >>> own_special_tokens(model.tokenizer)          # so the paper format calls it without special tokens
    False
"""

import weakref
from typing import Any

from lensprobe.core.lazy import heavy

__all__ = ["own_special_tokens", "own_tokenizer"]

_LOADED: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def own_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` as ``AutoTokenizer.from_pretrained(tokenizer.name_or_path)`` loads it, with no argument
    (the authors' call, and lm-eval's ``hf`` model's by default), loaded once per tokenizer.

    A tokenizer that was not given ``add_bos_token`` (its ``init_kwargs`` do not hold it) is the one its
    files load and is returned as it is, as is a tokenizer whose ``name_or_path`` does not load (built in
    memory: nothing else to compare it with).

    Args:
        tokenizer: a Hugging Face tokenizer, e.g. ``model.tokenizer`` of a TransformerLens model.

    Example:
        >>> own_tokenizer(model.tokenizer)("a").input_ids   # SmolLM2: no BOS of its own
        [81]
    """
    if getattr(tokenizer, "init_kwargs", {}).get("add_bos_token") is None:
        return tokenizer
    return _reload(tokenizer) or tokenizer


def own_special_tokens(tokenizer: Any) -> bool:
    """Whether one plain call of ``tokenizer`` as loaded on its own (:func:`own_tokenizer`) adds special
    tokens to a text: ``tokenizer(text, add_special_tokens=own_special_tokens(tokenizer))`` is then that
    call's ids, with ``tokenizer`` itself (its vocabulary, and however it is wrapped).

    Example:
        >>> own_special_tokens(lp.load_model().tokenizer)   # SmolLM2 adds nothing by itself
        False
    """
    own = own_tokenizer(tokenizer)
    if own is tokenizer:
        return True  # the tokenizer as it loads: its own call
    return list(own("a").input_ids) != list(own("a", add_special_tokens=False).input_ids)


def _reload(tokenizer: Any) -> Any:
    """The tokenizer loaded again from its ``name_or_path`` (``None`` when it cannot be), cached."""
    try:
        return _LOADED[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: nothing cached
        return _load(tokenizer)
    _LOADED[tokenizer] = loaded = _load(tokenizer)
    return loaded


def _load(tokenizer: Any) -> Any:
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if not name:
        return None
    try:
        return heavy("transformers").AutoTokenizer.from_pretrained(name)
    except Exception:  # noqa: BLE001 - no such folder, or a hub name out of reach: kept as it is
        return None
