"""The lm-eval adapter against plain ``transformers`` by hand: loglikelihoods (batched or not, with a filler,
head ablation or ARM attached), greedy generations, and lm-eval's accuracy on local tasks (tests/fixtures/lmeval)."""

import subprocess
import sys
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager
from transformers import AutoTokenizer

import lensprobe as lp
from lensprobe.core.models.testing import tiny_tokenizer
from lensprobe.evals.lmeval import LensprobeLM, lm_eval_accuracy
from lensprobe.interventions.arm import arm_redistribute

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "lmeval"
MLESS = " ".join(["/"] * 55)  # the paper's meaningless filler, written out
REQUESTS = [("What is 12+7?", " The answer is 19."), ("The cat", " sat on the mat"), ("", "hello there"),
            ("A random sentence of real words", " x"), ("Q", " the quick brown fox jumps over the lazy dog")]


class Request:
    """An lm-eval request as the model reads it (``.args``)."""

    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def tok():
    """The tiny model's tokenizer as plain transformers loads it (no TransformerLens settings)."""
    return AutoTokenizer.from_pretrained(tiny_tokenizer().name_or_path)


@pytest.fixture(scope="module")
def tasks():
    return TaskManager(include_path=str(TASKS), include_defaults=False)


def by_hand(hf, tok, context, continuation, edit=None):
    """log P(continuation | context) and whether it is greedy, on the plain model: the sum of the
    log-softmax at the positions that predict the continuation's tokens. ``edit(hf)`` attaches hooks
    (returns their handles)."""
    ctx = tok(context, add_special_tokens=False).input_ids if context else [tok.bos_token_id]
    whole = ctx + tok(continuation, add_special_tokens=False).input_ids if not context else \
        tok(context + continuation, add_special_tokens=False).input_ids
    cont = whole[len(ctx):]
    handles = edit(hf) if edit else []
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([whole[:-1]])).logits[0, len(ctx) - 1:].double()
    finally:
        for h in handles:
            h.remove()
    logp = torch.log_softmax(logits, -1)
    target = torch.tensor(cont)
    return float(logp[torch.arange(len(cont)), target].sum()), bool((logp.argmax(-1) == target).all())


def zero_heads(heads, d_head):
    """Zero query heads ``(layer, head)`` at the input of ``o_proj`` (the heads' outputs, concatenated)."""
    def edit(hf):
        def pre(head):
            def fn(_m, args):
                x = args[0].clone()
                x[..., head * d_head:(head + 1) * d_head] = 0
                return (x,)
            return fn
        return [hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre(head)) for layer, head in heads]
    return edit


def arm_at_layer0(arm):
    """ARM's rule on ``act_fn(gate_proj(x))`` of layer 0 of the plain model, one row, its own seeded generator."""
    def edit(hf):
        def fn(_m, _args, out):
            gen = torch.Generator().manual_seed(arm.seed)
            return arm_redistribute(out[0], generator=gen, **arm.rule())[None]
        return [hf.model.layers[0].mlp.act_fn.register_forward_hook(fn)]
    return edit


def scores(lm, requests=REQUESTS):
    return lm.loglikelihood([Request(*r) for r in requests], disable_tqdm=True)


def assert_scores(got, want, tol=2e-4):
    for (g, g_greedy), (w, w_greedy) in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=tol)
        assert g_greedy == w_greedy


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_loglikelihoods_equal_plain_transformers(tiny, tiny_hf, tok, batch_size):
    want = [by_hand(tiny_hf, tok, c, x) for c, x in REQUESTS]
    assert_scores(scores(LensprobeLM(tiny, batch_size=batch_size)), want)


def test_requests_score_as_lm_evals_own_hf_model_on_the_same_weights(tiny, tiny_hf, tok):
    from lm_eval.models.huggingface import HFLM

    hf_lm = HFLM(pretrained=tiny_hf, tokenizer=tok, batch_size=2, device="cpu")
    assert_scores(scores(LensprobeLM(tiny, batch_size=3)), hf_lm.loglikelihood([Request(*r) for r in REQUESTS]))
    text = [Request("The quick brown fox jumps over the lazy dog. What is 3*4?")]
    assert LensprobeLM(tiny).loglikelihood_rolling(text) == pytest.approx(hf_lm.loglikelihood_rolling(text), abs=2e-4)


def test_a_filler_scores_as_the_prompt_with_the_filler_text(tiny, tiny_hf, tok):
    got = scores(LensprobeLM(tiny, "w/ Mless", batch_size=3))
    assert_scores(got, [by_hand(tiny_hf, tok, MLESS + c, x) for c, x in REQUESTS])
    plain = scores(LensprobeLM(tiny, batch_size=3))
    assert all(abs(a - b) > 1e-3 for (a, _), (b, _) in zip(got, plain, strict=True))


def test_head_ablation_scores_as_zeroed_heads_by_hand(tiny, tiny_hf, tok):
    d_head = tiny.cfg.d_head
    lm = LensprobeLM(tiny, "mless", ablate="L0H1 L1H3", batch_size=2)
    assert lm.condition.name == "w/ Mless, L0H1 L1H3 ablated"
    want = [by_hand(tiny_hf, tok, MLESS + c, x, zero_heads([(0, 1), (1, 3)], d_head)) for c, x in REQUESTS]
    assert_scores(scores(lm), want)


def test_arm_scores_as_its_rule_applied_by_hand_to_each_request_alone(tiny, tiny_hf, tok):
    lm = LensprobeLM(tiny, "ARM", c=0.1, percentile=95, seed=3, batch_size=3)
    (arm,) = lm.condition.interventions
    assert (arm.c, arm.percentile, arm.seed) == (0.1, 95, 3)
    want = [by_hand(tiny_hf, tok, c, x, arm_at_layer0(arm)) for c, x in REQUESTS]
    assert_scores(scores(lm), want)
    assert all(abs(a - b) > 1e-4 for (a, _), (b, _) in zip(want, [by_hand(tiny_hf, tok, c, x) for c, x in REQUESTS],
                                                           strict=True))


def test_loglikelihood_rolling_sums_every_token_after_the_bos(tiny, tiny_hf, tok):
    text = "The quick brown fox jumps over the lazy dog. What is 3*4?"
    (got,) = LensprobeLM(tiny).loglikelihood_rolling([Request(text)], disable_tqdm=True)
    assert got == pytest.approx(by_hand(tiny_hf, tok, "", text)[0], abs=2e-4)


def test_simple_evaluate_accuracy_is_the_argmax_of_the_loglikelihoods_by_hand(tiny, tiny_hf, tok, tasks):
    import json

    rows = [json.loads(line) for line in (TASKS / "mc.jsonl").read_text().splitlines()]

    def accuracy(filler):
        right = []
        for row in rows:
            lls = [by_hand(tiny_hf, tok, filler + f"Question: {row['question']}\nAnswer:", f" {c}")[0]
                   for c in row["choices"]]
            right.append(max(range(len(lls)), key=lls.__getitem__) == row["label"])
        return sum(right) / len(right)

    want = {"w/o": accuracy(""), "w/ Mless": accuracy(MLESS)}
    res = lm_eval.simple_evaluate(model="lensprobe", model_args={"pretrained": tiny, "condition": "w/ Mless"},
                                  tasks=["lensprobe_mc"], batch_size=2, task_manager=tasks, log_samples=False)
    assert res["results"]["lensprobe_mc"]["acc,none"] == pytest.approx(want["w/ Mless"])
    table = lm_eval_accuracy(tiny, ["lensprobe_mc"], "w/o,w/ Mless", include_path=str(TASKS),
                             include_defaults=False, batch_size=3)
    assert table[["task", "condition", "filter", "n"]].values.tolist() == [
        ["lensprobe_mc", "w/o", "none", 5], ["lensprobe_mc", "w/ Mless", "none", 5]]
    assert dict(zip(table["condition"], table["accuracy"], strict=True)) == pytest.approx(want)
    assert (table["stderr"] > 0).all()


def test_generate_until_is_greedy_transformers_cut_at_until(tiny, tiny_hf, tok, tasks):
    import json

    rows = [json.loads(line) for line in (TASKS / "gen.jsonl").read_text().splitlines()]
    lm = LensprobeLM(tiny, "w/ Mless", batch_size=2)
    res = lm_eval.simple_evaluate(model=lm, tasks=["lensprobe_gen"], task_manager=tasks, log_samples=True)
    want = []
    for row in rows:
        ids = torch.tensor([tok(MLESS + f"Q: {row['question']}\nA:", add_special_tokens=False).input_ids])
        with torch.no_grad():
            out = tiny_hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        want.append(text.split("\n")[0].split("Q:")[0])
    got = {s["doc"]["question"]: s["resps"][0][0] for s in res["samples"]["lensprobe_gen"]}
    assert [got[row["question"]] for row in rows] == want
    matches = [w.strip() == row["answer"] for w, row in zip(want, rows, strict=True)]
    assert res["results"]["lensprobe_gen"]["exact_match,none"] == pytest.approx(sum(matches) / len(rows))


def test_model_args_are_checked_before_any_request(tiny):
    with pytest.raises(lp.LensprobeError, match="needs ARM settings"):
        LensprobeLM(tiny, "w/ Mless+ARM")
    with pytest.raises(lp.LensprobeError, match="no ARM preset for 'lensprobe-tiny-llama' on math500"):
        LensprobeLM(tiny, "ARM", arm="preset")  # the tiny model is none of the authors' models
    arm = lp.ARM.preset("Qwen/Qwen2.5-Math-7B", "aime2024", seed=0)
    assert LensprobeLM(tiny, "mless+arm", arm=arm).condition.interventions == (arm,)
    with pytest.raises(lp.LensprobeError, match="builds its own prompts"):
        LensprobeLM(tiny, lp.Condition("own", build=lambda model, q: lp.build_prompt(model, q)))
    with pytest.raises(lp.LensprobeError, match="batch_size"):
        LensprobeLM(tiny, batch_size="auto")
    assert LensprobeLM(tiny, batch_size="4").batch_size == 4


def test_a_request_longer_than_the_context_is_refused_not_cut(tiny):
    lm = LensprobeLM(tiny, "w/ Mless")
    long = " ".join(["the cat sat on the mat"] * 30)  # fits the tiny model's 256 tokens, not with the filler
    with pytest.raises(lp.LensprobeError, match="does not truncate"):
        lm.loglikelihood([Request(long, " x")])
    assert len(lm.tok_encode(long)) < tiny.cfg.n_ctx < len(lm.tok_encode(lm.prompt_text(long)))


def test_the_installed_package_declares_the_lm_eval_entry_point():
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="lm_eval.models") if e.name == "lensprobe"]
    assert point.load() is LensprobeLM
    assert lm_eval.api.registry.get_model("lensprobe") is LensprobeLM


@pytest.mark.slow
def test_the_command_line_runs_a_local_task_on_a_model_folder(tiny, tiny_hf, tok, tmp_path):
    folder = tmp_path / "tiny"
    tiny_hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = subprocess.run(
        [sys.executable, "-m", "lensprobe.evals.lmeval", "--model", "lensprobe", "--model_args",
         f"pretrained={folder},condition=w/ Mless", "--batch_size", "2", "--device", "cpu", "--tasks", "lensprobe_mc",
         "--include_path", str(TASKS), "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    want = lm_eval_accuracy(tiny, ["lensprobe_mc"], "w/ Mless", include_path=str(TASKS), include_defaults=False)
    line = next(line for line in out.stdout.splitlines() if "lensprobe_mc" in line and "acc" in line)
    cells = [cell.strip() for cell in line.split("|")]
    value = cells[cells.index("acc") + 2]  # |lensprobe_mc|Yaml|none|0|acc|↑|value|±|stderr|
    assert float(value) == pytest.approx(want["accuracy"][0], abs=1e-4)


def test_loglikelihoods_equal_plain_transformers_on_the_embedded_model(smol, smol_hf):
    tok = AutoTokenizer.from_pretrained(smol_hf.name_or_path)
    requests = [("Question: What is 12+7?\nAnswer:", " 19"), ("The capital of France is", " Paris"),
                ("", "The quick brown fox"), ("Question: Which is larger, 3 or 30?\nAnswer:", " 30, since 30 > 3")]
    want = [by_hand(smol_hf, tok, MLESS + c, x) for c, x in requests]
    # float32 sums over 60-80 positions of a 30-layer model: padded batches round differently (measured: 2.3e-4)
    assert_scores(scores(LensprobeLM(smol, "w/ Mless", batch_size=3), requests), want, tol=1e-3)
    assert_scores(scores(LensprobeLM(smol, "w/ Mless", batch_size=1), requests), want, tol=1e-3)


def test_lm_eval_accuracy_loads_the_model_and_reads_its_facts_once(tiny, monkeypatch):
    """Several conditions, one load: each condition's LensprobeLM takes the loaded model and its facts."""
    import lensprobe.evals.lmeval as lmeval
    from lensprobe.core.models.facts import ModelFacts

    loads, made = [], []
    real_load, real_init = lmeval.load_model, ModelFacts.__init__
    monkeypatch.setattr(lmeval, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(ModelFacts, "__init__", lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    table = lm_eval_accuracy(tiny, ["lensprobe_mc"], "w/o,w/ Mless,w/ Mful", include_path=str(TASKS),
                             include_defaults=False, batch_size=3, limit=2)
    assert list(table["condition"]) == ["w/o", "w/ Mless", "w/ Mful"]
    assert (len(loads), len(made)) == (1, 1)
    with pytest.raises(lp.LensprobeError, match="facts= is for a model already loaded"):
        LensprobeLM(tiny, "w/o", device="cpu", facts=lmeval.model_facts(tiny))


@pytest.mark.parametrize(("tasks", "conditions", "metric", "message"), [
    (["lensprobe_mc"], "", "acc", "conditions: expected at least one condition"),
    (["lensprobe_mc"], " , ", "acc", "conditions: expected at least one condition"),
    (["lensprobe_mc"], "w/o,w/ Mless,w/o", "acc", "conditions: 'w/o' is given twice: name each condition once"),
    ([], "w/o", "acc", "tasks: expected lm-eval task names"),
    (["lensprobe_mc"], "w/o", "", "metric: expected an lm-eval metric name"),
])
def test_lm_eval_accuracy_refuses_bad_runs_before_the_model_loads(monkeypatch, tasks, conditions, metric, message):
    from lensprobe.evals import lmeval

    monkeypatch.setattr(lmeval, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(lp.core.errors.SettingError, match=message):
        lm_eval_accuracy("tiny", tasks, conditions, metric=metric)


def test_a_metric_a_task_does_not_report_is_refused_naming_those_it_does(tiny):
    with pytest.raises(lp.core.errors.SettingError, match=r"metric: task lensprobe_mc reports no metric 'accuracy': "
                                                          r"use one of \['acc'"):
        lm_eval_accuracy(tiny, ["lensprobe_mc"], "w/o", include_path=str(TASKS), include_defaults=False,
                         limit=2, metric="accuracy")


@pytest.mark.unchecked
def test_max_gen_toks_is_a_whole_number(tiny):
    lm = LensprobeLM(tiny, "w/o")
    with pytest.raises(lp.core.errors.SettingError, match=r"max_gen_toks: expected a whole number .*got 4.0 \(float\)"):
        lm.generate_until([Request("Q:", {"until": ["\n"], "max_gen_toks": 4.0})])
    assert len(lm.generate_until([Request("Q:", {"until": ["\n"], "max_gen_toks": 4})])) == 1
