"""One metric vocabulary: every name of ``METRIC_NAMES`` (and a continuation) is taken by sweeps, patching,
attribution and its verification wherever the math allows, each value checked against the logits of a
plain ``transformers`` twin computed by hand; attribution refuses the attention metrics, saying why."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.measures.forced import METRIC_NAMES
from lensprobe.experiments.attribution import attribute_heads
from lensprobe.experiments.patching import patch
from lensprobe.experiments.sweep import ablation_sweep
from lensprobe.experiments.verify import verify_attribution

# the settings each metric name needs, as every study takes them
SETTINGS = {
    "entropy": {},
    "logprob": {"answers": "19"},
    "logit_diff": {"tokens": (5, 9)},
    "attention:<segment>": {},
}


def metric_name(name: str) -> str:
    return "attention:filler" if name == "attention:<segment>" else name


@pytest.fixture(scope="module")
def prompt(tiny):
    return lp.build_prompt(tiny, "What is 12+7?", filler=lp.Filler.meaningless(count=5))


def by_hand(twin, tokenizer, prompt, name: str) -> float:
    """The metric from the twin's logits (and attention weights), written out."""
    tokens = prompt.tokens.cpu()
    if name == "logprob":
        answer = torch.tensor([tokenizer.encode(SETTINGS["logprob"]["answers"], add_special_tokens=False)])
        full = torch.cat([tokens, answer], dim=-1)
        with torch.no_grad():
            logp = torch.log_softmax(twin(full).logits[0].double(), -1)
        n = tokens.shape[-1]
        return float(sum(logp[n - 1 + i, t] for i, t in enumerate(answer[0].tolist())))
    with torch.no_grad():
        out = twin(tokens, output_attentions=True)
    last = out.logits[0, -1].double()
    if name == "entropy":
        p = torch.softmax(last, -1)
        return float(-(p * torch.log(p)).sum())
    if name == "logit_diff":
        return float(last[5] - last[9])
    filler = prompt.positions("filler")
    after = [q for q in range(tokens.shape[-1]) if q > max(filler)]
    per_layer = [A[0][:, after][:, :, filler].sum(-1).mean() for A in out.attentions]
    return float(torch.stack(per_layer).mean())


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_every_metric_name_works_in_a_sweep_and_in_patching(tiny, prompt, twin_of, name):
    metric, kw = metric_name(name), SETTINGS[name]
    res = ablation_sweep(tiny, prompt, metric, heads=["L0H1"], progress=False, **kw)
    assert res.baseline[0].item() == pytest.approx(by_hand(twin_of(tiny), tiny.tokenizer, prompt, name), rel=1e-4, abs=1e-5)
    one = {"answer": kw["answers"]} if "answers" in kw else {k: v for k, v in kw.items()}
    out = patch(tiny, prompt, prompt, "blocks.0.hook_resid_post", metric=metric, **one)
    table = out.to_dataframe()
    assert table["clean"].iloc[0] == pytest.approx(res.baseline[0].item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", [n for n in METRIC_NAMES if not n.startswith("attention")])
def test_every_differentiable_metric_works_in_attribution_and_verification(tiny, prompt, name):
    metric, kw = metric_name(name), SETTINGS[name]
    att = attribute_heads(tiny, prompt, metric, **kw)
    ver = verify_attribution(tiny, prompt, metric, att, top=2, sample=0)
    exact = ablation_sweep(tiny, prompt, metric, heads=list(ver.table["head_label"]), progress=False, **kw)
    for row in ver.table.itertuples():
        assert row.exact == pytest.approx(float(exact.table.loc[row.layer, row.head]), rel=1e-4, abs=1e-5)


def test_attribution_refuses_attention_metrics_saying_why(tiny, prompt):
    with pytest.raises(lp.LensprobeError, match="no gradient.*lp.ablation_sweep"):
        attribute_heads(tiny, prompt, "attention:filler")


def test_an_unknown_metric_names_the_vocabulary(tiny, prompt):
    for run in (lambda: ablation_sweep(tiny, prompt, "entropi", progress=False),
                lambda: patch(tiny, prompt, prompt, "blocks.0.hook_resid_post", metric="entropi"),
                lambda: attribute_heads(tiny, prompt, "entropi")):
        with pytest.raises(lp.LensprobeError, match="unknown metric 'entropi'.*logit_diff.*attention:<segment>"):
            run()


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("entropy", {"answers": "19"}, r"metric 'entropy' reads no answer, but one was given \('19'\)"),
    ("entropy", {"tokens": (5, 9)}, r"tokens=\(5, 9\) were given, but only metric 'logit_diff' reads them"),
    ("logprob", {"answers": "19", "tokens": (5, 9)}, "only metric 'logit_diff' reads them, not 'logprob'"),
])
def test_an_answer_or_tokens_the_metric_does_not_read_are_refused(tiny, prompt, name, settings, message):
    for run in (lambda: ablation_sweep(tiny, prompt, name, heads=["L0H1"], progress=False, **settings),
                lambda: attribute_heads(tiny, prompt, name, **settings)):
        with pytest.raises(lp.LensprobeError, match=message):
            run()


@pytest.mark.parametrize(("returned", "what"), [
    (lambda logits: None, "NoneType 'None'"), (lambda logits: "high", "str 'high'"),
    (lambda logits: logits[:, -1, 0].to(torch.complex64), "torch.complex64 values"),
])
def test_a_metric_function_must_return_real_numbers(tiny, prompt, returned, what):
    def metric(logits, p):
        return returned(logits)

    for run in (lambda: ablation_sweep(tiny, prompt, metric, heads=["L0H1"], progress=False),
                lambda: attribute_heads(tiny, prompt, metric)):
        with pytest.raises(lp.LensprobeError, match=rf"the metric function 'metric' returned {what}: it must return "
                                                    "real numbers"):
            run()


def test_token_ids_outside_the_vocabulary_are_refused_as_generate_refuses_them(tiny):
    bad = torch.tensor([[1, 2, tiny.cfg.d_vocab + 5]])
    for run in (lambda: lp.forward(tiny, bad), lambda: attribute_heads(tiny, bad, "entropy"),
                lambda: ablation_sweep(tiny, bad, "entropy", heads=["L0H1"], progress=False),
                lambda: lp.generate(tiny, bad, max_new_tokens=2)):
        with pytest.raises(lp.LensprobeError, match=rf"token id {tiny.cfg.d_vocab + 5} is outside the vocabulary "
                                                    rf"\(0-{tiny.cfg.d_vocab - 1}\)"):
            run()
    with pytest.raises(lp.LensprobeError, match="token id -1 is outside the vocabulary"):
        lp.forward(tiny, [1, -1, 2])
