"""AtP for each family against torch.autograd on the plain transformers model: each head's estimate is
``sum(-z * dmetric/dz)`` over its slice of o_proj's input, the gradient taken by hand."""

import torch
from oracles import hf_head_gradients

import lensprobe as lp
from lensprobe.experiments.attribution import attribute_heads


class TextDecoder:
    """The plain model seen where :func:`oracles.hf_head_gradients` looks: ``.model.layers`` and
    ``.config.num_hidden_layers`` of the text decoder (behind Gemma3ForConditionalGeneration's wrapper)."""

    def __init__(self, fam):
        self.model = type("Decoder", (), {"layers": fam.layers()})()
        self.config = fam.plain.config.get_text_config()
        self.plain = fam.plain

    def __call__(self, *args, **kwargs):
        return self.plain(*args, **kwargs)


def entropy_of_last(logits):
    logp = torch.log_softmax(logits[-1].double(), -1)
    return -(logp.exp() * logp).sum()


def test_atp_equals_autograd_on_the_plain_model(fam):
    p = lp.build_prompt(fam.model, "What is 12+7?", system="Please reason step by step.",
                        filler=lp.Filler.meaningless(count=5))
    att = attribute_heads(fam.model, p, "entropy")
    zs, grads, _ = hf_head_gradients(TextDecoder(fam), p.tokens, entropy_of_last)
    d, cfg = fam.model.cfg.d_head, fam.model.cfg
    want = torch.tensor([[float((-zs[layer][0, :, h * d:(h + 1) * d] * grads[layer][0, :, h * d:(h + 1) * d]).sum())
                          for h in range(cfg.n_heads)] for layer in range(cfg.n_layers)], dtype=torch.float64)
    got = att.grid().double()
    assert want.abs().max() > 0
    assert torch.linalg.norm(got - want) <= 1e-4 * torch.linalg.norm(want)
    with torch.inference_mode():
        clean = entropy_of_last(fam.plain(p.tokens).logits[0])
    assert abs(att.values[0] - float(clean)) <= 1e-5 * float(clean)
