"""The random-sentence control of the meaningless-tokens paper: real words in random order with
exactly as many tokens as the filler they stand in for, built in time linear in its length."""

import random

from lensprobe.core.errors import LensprobeError

__all__ = ["random_sentence_text"]

# Common English words for the random-sentence control (short, frequent, one or two tokens).
_WORDS = (
    "the of and to in is was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find any new work part take "
    "get place made live where after back little only round man year came show every good me "
    "give our under name very through just form sentence great think say help low line differ "
    "turn cause much mean before move right boy old too same tell does set three want air well "
    "also play small end put home read hand port large spell add even land here must big high "
    "such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep "
    "eye never last let thought city tree cross farm hard start might story saw far sea draw "
    "left late run while press close night real life few north open seem together next white "
    "children begin got walk example ease paper group always music those both mark often letter"
).split()


def _n_tokens(tokenizer, text: str) -> int:
    """Number of tokens of ``text`` (no special tokens added)."""
    return len(tokenizer.encode(text, add_special_tokens=False))


def random_sentence_text(tokenizer, n_tokens: int, seed: int = 0) -> str:
    """A sentence of random common words that is exactly ``n_tokens`` tokens long.

    Words are added in random order while the count stays at or under ``n_tokens``; the
    last gap is filled with one-token words. Deterministic for a given seed and tokenizer.
    Linear in ``n_tokens``: each word's token count is measured once (with its leading space)
    and the sentence is tokenized once to confirm; a tokenizer whose counts do not add up across
    words gets the longest fitting prefix by binary search, then the gap filled word by word.
    """
    rng = random.Random(seed)
    cost: dict[str, int] = {}
    words: list[str] = []
    count = tries = 0
    while count < n_tokens and tries < 50 * n_tokens + 100:
        tries += 1
        cand = rng.choice(_WORDS)
        piece = cand if not words else " " + cand
        if piece not in cost:
            cost[piece] = _n_tokens(tokenizer, piece)
        if count + cost[piece] <= n_tokens:
            words.append(cand)
            count += cost[piece]
    if count != n_tokens or _n_tokens(tokenizer, " ".join(words)) != n_tokens:
        words = _fit_words(tokenizer, words, n_tokens, rng)
    return " ".join(words)


def _fit_words(tokenizer, words: list[str], n_tokens: int, rng: random.Random) -> list[str]:
    """The longest prefix of ``words`` within ``n_tokens`` (binary search), then random words added
    one at a time while they fit, for tokenizers whose counts do not add up across words."""
    lo, hi = 0, len(words)  # invariant: words[:lo] fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _n_tokens(tokenizer, " ".join(words[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    words = words[:lo]
    count = _n_tokens(tokenizer, " ".join(words)) if words else 0
    for _ in range(200):
        if count == n_tokens:
            return words
        cand = rng.choice(_WORDS)
        c = _n_tokens(tokenizer, " ".join(words + [cand]))
        if c <= n_tokens:
            words, count = words + [cand], c
    if count == n_tokens:
        return words
    raise LensprobeError(
        f"could not build a random sentence of exactly {n_tokens} tokens with this "
        "tokenizer; pass Filler.text(...) with your own sentence instead."
    )
