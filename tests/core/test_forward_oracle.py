"""Oracle tests: lensprobe's attention metrics vs plain ``transformers`` and by-hand loops.

The reference numbers come from a Hugging Face model built on its own (eager attention,
``output_attentions=True``), with each metric computed by an explicit loop written from
its definition, never through ``lensprobe.core.measures.metrics``.
"""

import pytest
import torch

import lensprobe as lp

TOL = 1e-5


def received_by_hand(pattern: torch.Tensor) -> torch.Tensor:
    """[head, q, k] -> [head, k]: for each key j, the mean of A[i, j] over queries i > j."""
    rows = pattern.double().tolist()  # plain floats: an independent, loop-by-loop computation
    heads, n = len(rows), len(rows[0])
    out = [[float("nan")] * n for _ in range(heads)]
    for h in range(heads):
        for j in range(n - 1):
            total = 0.0
            for i in range(j + 1, n):
                total += rows[h][i][j]
            out[h][j] = total / (n - 1 - j)
    return torch.tensor(out, dtype=torch.float64)


def proportion_by_hand(pattern: torch.Tensor, keys: list[int], queries: list[int]) -> torch.Tensor:
    """[head, q, k] -> [head]: mean over the queries of the attention summed over the keys."""
    rows = pattern.double().tolist()
    out = []
    for head in rows:
        per_query = [sum(head[i][j] for j in keys) for i in queries]
        out.append(sum(per_query) / len(per_query))
    return torch.tensor(out, dtype=torch.float64)


def check_against(lp_model, hf_model, prompt, layers):
    with torch.inference_mode():
        ref = hf_model(prompt.tokens, output_attentions=True)
    assert len(ref.attentions) == lp_model.cfg.n_layers
    pats = lp.attention_patterns(lp_model, prompt, layers=layers)
    filler = prompt.positions("filler")
    after_filler = list(range(filler[-1] + 1, len(prompt)))
    question = prompt.positions("question")
    for layer in layers:
        hf_pattern = ref.attentions[layer][0]  # [head, q, k]
        torch.testing.assert_close(pats[layer], hf_pattern, atol=TOL, rtol=0)

        recv = lp.metrics.average_attention_received(pats[layer]).double()
        torch.testing.assert_close(recv, received_by_hand(hf_pattern), atol=TOL, rtol=0, equal_nan=True)

        prop = lp.metrics.attention_proportion(pats[layer], filler).double()  # default queries: after the filler
        torch.testing.assert_close(prop, proportion_by_hand(hf_pattern, filler, after_filler), atol=TOL, rtol=0)
        prop_q = lp.metrics.attention_proportion(pats[layer], filler, query_positions=question).double()
        torch.testing.assert_close(prop_q, proportion_by_hand(hf_pattern, filler, question), atol=TOL, rtol=0)
    return ref.logits


def test_smollm2_filler_prompt_matches_transformers(smol, smol_hf):
    p = lp.build_prompt(smol, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    assert len(p.positions("filler")) == 55
    hf_logits = check_against(smol, smol_hf, p, layers=[0, 1, 15, 29])
    # entropy of the next-token distribution at every position, vs torch.distributions
    logits = lp.forward(smol, p)
    torch.testing.assert_close(logits, hf_logits, atol=TOL, rtol=0)
    theirs = torch.distributions.Categorical(logits=hf_logits[0].double()).entropy()
    torch.testing.assert_close(lp.metrics.entropy(logits[0].double()), theirs, atol=1e-10, rtol=0)
    # float32 logits: float32 sums over 49,152 terms, so agreement is to float32 accuracy
    ours = lp.metrics.entropy(logits)[0]
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), theirs, atol=1e-4, rtol=1e-5)
    assert (ours >= 0).all() and (ours <= torch.log(torch.tensor(float(smol.cfg.d_vocab)))).all()


def test_smollm2_all_layers_match_transformers(smol, smol_hf):
    p = lp.build_prompt(smol, "Find x if 2x+3=11.", system=lp.MATH_SYSTEM_PROMPT,
                        filler=lp.Filler.meaningful(count=20), placement="after_question")
    with torch.inference_mode():
        ref = smol_hf(p.tokens, output_attentions=True)
    pats = lp.attention_patterns(smol, p)  # every layer
    assert list(pats) == list(range(30))
    for layer, pattern in pats.items():
        torch.testing.assert_close(pattern, ref.attentions[layer][0], atol=TOL, rtol=0)


@pytest.mark.parametrize("placement", ["between", "before_system", "after_question"])
def test_tiny_model_matches_its_hf_model(tiny, tiny_hf, placement):
    p = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT,
                        filler=lp.Filler.meaningless(count=12), placement=placement)
    hf_logits = check_against(tiny, tiny_hf, p, layers=[0, 1])
    ours = lp.metrics.entropy(lp.forward(tiny, p))[0]  # vocabulary of 400: float32 agrees to 1e-5
    torch.testing.assert_close(ours, torch.distributions.Categorical(logits=hf_logits[0]).entropy(),
                               atol=TOL, rtol=0)


def test_kv_cached_step_pattern_matches_full_prompt(tiny, tiny_hf):
    """At a KV-cached step the pattern is [head, 1, T]; it and the proportion equal the plain model's
    uncached forward over the whole sequence."""
    p = lp.build_prompt(tiny, "What is 12+7?", filler=lp.Filler.meaningless(count=8))
    filler = p.positions("filler")
    rec = lp.interventions.AttentionRecorder(layers=[0, 1])
    with torch.inference_mode():
        logits, pkv = tiny(p.tokens, return_type="logits_and_cache")
        nxt = logits[:, -1:].argmax(-1)
        with lp.intervene(tiny, rec):
            step_logits, _ = tiny(nxt, past_key_values=pkv, return_type="logits_and_cache")
        full = torch.cat([p.tokens, nxt], dim=1)
        ref = tiny_hf(full, output_attentions=True)
    torch.testing.assert_close(step_logits[0, -1], ref.logits[0, -1], atol=TOL, rtol=0)
    for layer in (0, 1):
        step = rec.patterns[layer][0]
        assert step.shape == (tiny.cfg.n_heads, 1, full.shape[1])
        hf_pattern = ref.attentions[layer][0]
        torch.testing.assert_close(step[:, 0], hf_pattern[:, -1], atol=TOL, rtol=0)
        newest = [full.shape[1] - 1]
        torch.testing.assert_close(
            lp.metrics.attention_proportion(step, filler),
            proportion_by_hand(hf_pattern, filler, newest).float(), atol=TOL, rtol=0,
        )
