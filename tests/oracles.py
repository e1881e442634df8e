"""Computed by hand, for the tests: latent thinking inputs, and a hook that counts its calls."""

import torch


def latent_by_hand(h, logits, E, *, alpha, top_p, exclude, temperature=1.0):
    """alpha * h + (1 - alpha) * sum_w p~(w) E(w), p~ = top-p of the softmax with ``exclude`` masked,
    written as a loop over the sorted probabilities; also the number of tokens kept."""
    scaled = logits.double() / temperature
    p = torch.softmax(scaled.masked_fill(torch.arange(logits.shape[-1]) == exclude, float("-inf")), -1)
    kept, mass = [], 0.0
    for prob, i in sorted(((float(p[i]), i) for i in range(p.shape[0])), reverse=True):
        if mass >= top_p:
            break
        kept.append((prob, i))
        mass += prob
    norm = sum(prob for prob, _ in kept)
    soft = sum((prob / norm) * E[i].double() for prob, i in kept)
    return (alpha * h.double() + (1 - alpha) * soft).float(), len(kept)


class Counter:
    """A hook ``fn(activation, hook)`` that counts its calls and leaves the activation alone."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x, hook):
        self.calls += 1
        return None
