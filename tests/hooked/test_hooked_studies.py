"""The studies and the evaluation harness on a HookedTransformer: against the plain ``transformers`` twin
by hand, and (for the tables whose arithmetic the bridge tests check against ``transformers``) against
the same study on the TransformerBridge that holds the same weights."""

import pandas as pd
import pytest
import torch
from hooked_oracles import entropy_by_hand, greedy_without_cache, hf_run, set_heads

import lensprobe as lp
from lensprobe.evals import Problem
from lensprobe.prompts import Condition

pytestmark = pytest.mark.hooked

TOL = 1e-5
QUESTION = "What is 12+7?"


def test_attention_received_equals_arithmetic_on_the_plain_models_attention(hooked, hooked_hf):
    res = lp.studies.attention_received_by_condition(hooked, QUESTION, layers=[1], heads=[0, 3])
    assert set(res.conditions) == {"w/o", "w/ Mless", "w/ Mful", "random sentence"}
    for cond, prompt in res.prompts.items():
        with torch.inference_mode():
            A = hooked_hf(prompt.tokens, output_attentions=True).attentions[1][0].double()  # [head, q, k]
        n = len(prompt)
        for head in (0, 3):
            rows = res.table[(res.table["condition"] == cond) & (res.table["head"] == head)]
            by_hand = [float(A[head, j + 1:, j].mean()) for j in range(n - 1)]
            assert list(rows["position"]) == list(range(n))
            assert max(abs(a - b) for a, b in zip(rows["attention"].iloc[:-1], by_hand, strict=True)) <= 1e-6
            assert pd.isna(rows["attention"].iloc[-1])


def frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False,
                                  atol=1e-5, rtol=0)


def test_filler_studies_equal_the_bridge_with_the_same_weights(hooked, tiny):
    a, b = (lp.studies.attention_received_by_condition(m, QUESTION, layers=[0, 1]) for m in (hooked, tiny))
    frames_equal(a.table, b.table)
    frames_equal(lp.studies.condition_changes(a), lp.studies.condition_changes(b))
    frames_equal(lp.studies.heads_by_change(a), lp.studies.heads_by_change(b))
    fa, fb = (lp.studies.filler_vs_random({"tiny": m}, QUESTION, layer=1, head=2) for m in (hooked, tiny))
    frames_equal(fa.table, fb.table)
    ta, tb = (lp.studies.compare_token_class_attention({"tiny": (m, lp.build_prompt(m, lp.studies.ascii_grid(rows=3, cols=6)))}, layers=[0, 1])
              for m in (hooked, tiny))
    frames_equal(ta, tb)
    assert ta["attention"].abs().sum() > 0


def test_mechanism_studies_equal_the_bridge_with_the_same_weights(hooked, tiny):
    pa, pb = lp.studies.mechanism_prompts(hooked, QUESTION, count=8), lp.studies.mechanism_prompts(tiny, QUESTION, count=8)
    assert {k: v.tokens.tolist() for k, v in pa.items()} == {k: v.tokens.tolist() for k, v in pb.items()}
    fit_a = lp.studies.filler_affine_fit(hooked, pa["w/ Mless"], pa["w/o"], layer=0)
    fit_b = lp.studies.filler_affine_fit(tiny, pb["w/ Mless"], pb["w/o"], layer=0)
    frames_equal(fit_a, fit_b)
    frames_equal(lp.studies.affine_fit_summary(fit_a), lp.studies.affine_fit_summary(fit_b))
    sa, sb = (lp.studies.activation_stats(m, {"w/o": p["w/o"], "w/ Mless": p["w/ Mless"]}, layer=0)
              for m, p in ((hooked, pa), (tiny, pb)))
    frames_equal(sa.histogram, sb.histogram)
    frames_equal(sa.summary, sb.summary)


def test_activation_stats_counts_the_gated_activations_of_the_question(hooked, hooked_hf):
    p = lp.studies.mechanism_prompts(hooked, QUESTION, count=8)["w/o"]
    stats = lp.studies.activation_stats(hooked, {"w/o": p}, layer=0, bins=[-10.0, 0.0, 10.0])
    got = {}
    mlp = hooked_hf.model.layers[0].mlp
    handle = mlp.gate_proj.register_forward_hook(lambda _m, _a, out: got.setdefault("gate", out.clone()))
    try:
        hf_run(hooked_hf, p.tokens)
    finally:
        handle.remove()
    a = mlp.act_fn(got["gate"][0, p.positions("question")])  # [question pos, d_mlp]
    counts = stats.histogram.sort_values("left")["count"].tolist()
    assert counts == [int((a < 0).sum()), int((a >= 0).sum())] and sum(counts) == a.numel()


def test_head_attention_over_generation_and_ablation_effect(hooked, hooked_hf):
    t = lp.studies.head_attention_over_generation(hooked, QUESTION, "L1H2", conditions=("w/o",), max_new_tokens=4)
    prompt = lp.build_prompt(hooked, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    assert t["position"].max() + 1 == len(prompt) + 4
    new, _ = greedy_without_cache(hooked_hf, prompt.tokens[0].tolist(), 4)
    seq = torch.tensor([prompt.tokens[0].tolist() + new])
    with torch.inference_mode():
        A = hooked_hf(seq, output_attentions=True).attentions[1][0, 2].double()
    by_hand = [float(A[j + 1:, j].mean()) for j in range(seq.shape[1] - 1)]
    assert max(abs(x - y) for x, y in zip(t["attention"].iloc[:-1], by_hand, strict=True)) <= 1e-6
    eff = lp.studies.ablation_effect(hooked, prompt, lp.ablate_heads("L0H1"))
    clean = hf_run(hooked_hf, prompt.tokens).logits[0, -1]
    after = hf_run(hooked_hf, prompt.tokens, o_proj={0: set_heads([1], 16)}).logits[0, -1]
    assert abs(eff.summary["entropy_clean"] - entropy_by_hand(clean)) <= TOL
    assert abs(eff.summary["entropy_ablated"] - entropy_by_hand(after)) <= TOL
    assert abs(eff.summary["max_abs_logit_change"] - float((after - clean).abs().max())) <= TOL


def test_evaluate_two_problems_on_a_hooked_transformer(hooked, hooked_hf, tmp_path):
    probs = [Problem(id="a", problem="What is 1+1?", answer="2"), Problem(id="b", problem="What is 3*4?", answer="12")]
    ablated = Condition("w/o, L0H1 ablated", interventions=(lp.ablate_heads("L0H1"),))
    rows = lp.evaluate(hooked, probs, ["w/o", "w/ Mless", ablated], out=tmp_path, max_new_tokens=6, batch_size=2,
                       progress=False)
    assert len(rows) == 6 and set(rows["condition"]) == {"w/o", "w/ Mless", ablated.name}
    eos = hooked.tokenizer.eos_token_id
    for cond in ("w/o", "w/ Mless", ablated):
        name = cond if isinstance(cond, str) else cond.name
        build = (lp.evals.builtin_condition(cond) if isinstance(cond, str) else cond).prompt_builder(hooked)
        for prob in probs:
            prompt = build(prob.problem)
            edits = {0: set_heads([1], 16)} if name == ablated.name else {}
            ids, tokens = prompt.tokens[0].tolist(), []
            for _ in range(6):  # greedy, uncached, on the plain model (the ablation made there by hand)
                nxt = int(hf_run(hooked_hf, torch.tensor([ids]), o_proj=edits).logits[0, -1].argmax())
                tokens.append(nxt)
                ids.append(nxt)
                if nxt == eos:
                    break
            row = rows[(rows["condition"] == name) & (rows["problem_id"] == prob.id)].iloc[0]
            assert row["generation"] == hooked.tokenizer.decode(tokens[:-1] if tokens[-1] == eos else tokens)
            assert row["generated_tokens"] == len(tokens) and row["prompt"] == prompt.text
            assert row["math-verify"] == lp.grade(lp.evals.extract_boxed(row["generation"]), prob.answer)
    again = lp.evaluate(hooked, probs, ["w/o", "w/ Mless", ablated], out=tmp_path, max_new_tokens=6, batch_size=2,
                        progress=False)  # resumed: nothing new is generated, the same rows come back
    cols = ["condition", "problem_id", "generation"]
    frames_equal(again[cols].sort_values(cols[:2]), rows[cols].sort_values(cols[:2]))
