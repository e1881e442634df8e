"""Forward passes, attention patterns, metrics and measures on a HookedTransformer, against the plain
``transformers`` twin (``output_attentions=True``) and arithmetic written out here."""

import pytest
import torch
from hooked_oracles import entropy_by_hand

import lensprobe as lp

pytestmark = pytest.mark.hooked

TOL = 1e-5


def hf_out(hf, tokens):
    with torch.inference_mode():
        return hf(tokens, output_attentions=True)


def test_forward_and_patterns_equal_the_plain_model(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[2]
    want = hf_out(hooked_hf, p.tokens)
    torch.testing.assert_close(lp.forward(hooked, p), want.logits, atol=TOL, rtol=0)
    pats = lp.attention_patterns(hooked, p, layers=[0, 1])
    assert set(pats) == {0, 1}
    for layer in (0, 1):
        assert pats[layer].shape == (4, len(p), len(p))  # [head, query, key]: one prompt, batch dropped
        torch.testing.assert_close(pats[layer], want.attentions[layer][0], atol=1e-6, rtol=0)
    two = torch.cat([p.tokens[:, :12], p.tokens[:, 5:17]])  # two rows of token ids
    batch = lp.attention_patterns(hooked, two, layers=1)
    torch.testing.assert_close(batch[1], hf_out(hooked_hf, two).attentions[1], atol=1e-6, rtol=0)
    with pytest.raises(lp.LensprobeError, match="layer 2 out of range: model has 2 layers"):
        lp.attention_patterns(hooked, p, layers=[2])


def test_metrics_on_hooked_patterns_equal_arithmetic_on_the_plain_models(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[2]
    A = hf_out(hooked_hf, p.tokens).attentions[0][0].double()  # [head, q, k]
    pats = lp.attention_patterns(hooked, p, layers=[0])[0]
    n = len(p)
    # average attention received by key j: the mean over queries i > j of A[i, j]
    by_hand = torch.stack([torch.stack([A[h, j + 1:, j].mean() if j + 1 < n else torch.tensor(float("nan"))
                                        for j in range(n)]) for h in range(A.shape[0])])
    got = lp.metrics.average_attention_received(pats).double()
    assert torch.allclose(got[:, :-1], by_hand[:, :-1], atol=1e-6)
    # attention proportion onto the filler: each query after it, summed over the filler keys, then averaged
    keys = p.positions("filler")
    after = range(max(keys) + 1, n)
    want = torch.stack([torch.stack([A[h, i, keys].sum() for i in after]).mean() for h in range(A.shape[0])])
    assert torch.allclose(lp.metrics.attention_proportion(pats, keys).double(), want, atol=1e-6)
    logits = lp.forward(hooked, p)[0, -1]
    assert abs(float(lp.metrics.entropy(logits)) - entropy_by_hand(hf_out(hooked_hf, p.tokens).logits[0, -1])) <= TOL


def test_measures_on_a_hooked_transformer(hooked, hooked_hf, hooked_prompts):
    p = hooked_prompts[2]
    want = hf_out(hooked_hf, p.tokens)
    got = lp.metrics.measure_once(hooked, lp.metrics.NextTokenEntropy(), p)
    assert got.shape == (1,) and abs(float(got[0]) - entropy_by_hand(want.logits[0, -1])) <= TOL
    answer = " 19 is the answer"
    ids = hooked.tokenizer.encode(answer, add_special_tokens=False)
    full = torch.cat([p.tokens, torch.tensor([ids])], 1)
    logp = torch.log_softmax(hf_out(hooked_hf, full).logits[0].double(), -1)
    by_hand = sum(float(logp[len(p) - 1 + i, tok]) for i, tok in enumerate(ids))
    assert len(ids) >= 2 and abs(float(lp.metrics.measure_once(hooked, lp.metrics.AnswerLogProb(answer), p)[0]) - by_hand) <= 1e-4
    keys = p.positions("system")
    after = range(max(keys) + 1, len(p))
    per_layer = [torch.stack([A[0, :, i, keys].sum(-1) for i in after]).mean(0) for A in want.attentions]
    att = lp.metrics.measure_once(hooked, lp.metrics.AttentionTo("system"), p)
    assert abs(float(att[0]) - float(torch.stack(per_layer).mean())) <= 1e-6
