"""No change that changes results reuses rows: each case run end to end into one folder, then against a
fresh folder. User code is refused until declared (its bytecode cannot show the globals it reads or the
helpers it calls), an edit of the weights through ``.data`` changes the model's identity, a changed default
enters it, a template of the same text but other tokens is another condition, a finished row whose prompt
now tokenizes otherwise is refused on resume, and the engine that ran is recorded."""

import dataclasses
import functools
import json

import pytest
import torch
from identities import snapshot

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.evals.problems.load import Problem

PROBLEMS = [Problem(id="q0", problem="What is 1+1?", answer="2", level=1, subject="S"),
            Problem(id="q1", problem="What is 2+2?", answer="4", level=1, subject="S")]
SHIFT = 0.0  # a global the hooks below read
SPELL = False  # a global the prompt builder below reads


def helper(act):
    return act + SHIFT


class GlobalShift:
    """Adds the global SHIFT to the residual stream after layer 0 through a helper: its own code never changes."""

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: helper(act))]


def run(model, conditions, out, **settings):
    return lp.evaluate(model, PROBLEMS, conditions, out=out, max_new_tokens=4, progress=False, **settings)


def generations(rows):
    return list(rows.sort_values(["condition", "problem_id"])["generation"])


def test_a_hook_reading_a_global_is_refused_until_declared_and_a_new_version_is_not_reused(tiny, tmp_path,
                                                                                           monkeypatch):
    folder = tmp_path / "run"
    cond = lp.Condition("shifted", interventions=(GlobalShift(),))
    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*GlobalShift at condition 'shifted' interventions"
                                                r"\[0\]: it is user code.*globals it reads.*lp.interventions.declare"
                                                r"\(GlobalShift, name='GlobalShift', version='1'\)"):
        run(tiny, [cond], folder)
    assert not folder.exists()  # refused before compute: nothing written
    assert len(run(tiny, [cond], None)) == 2  # kept in memory: nothing to reuse, no identity needed
    monkeypatch.setattr(GlobalShift, lp.core.storage.declared.DECLARED, ("global-shift", "1"), raising=False)
    first = run(tiny, [cond], folder)
    before = snapshot(folder)
    monkeypatch.setattr(__import__(__name__), "SHIFT", 30.0)  # the helper now computes something else ...
    monkeypatch.setattr(GlobalShift, lp.core.storage.declared.DECLARED, ("global-shift", "2"))  # ... declared
    with pytest.raises(lp.LensprobeError, match=r"already holds condition 'shifted' with a different definition:"
                                                r"\n.*version: folder has '1', this run has '2'"):
        run(tiny, [cond], folder)
    assert snapshot(folder) == before
    fresh = run(tiny, [cond], tmp_path / "fresh")
    assert generations(fresh) == generations(run(tiny, [cond], None))  # the fresh folder holds this code's rows
    assert generations(fresh) != generations(first)  # which the old folder's would have hidden


class OwnIdentity:
    """Declares its identity by its settings alone (``VERSION``: none, until the test gives one); its helper reads
    the global SHIFT."""

    VERSION: str | None = None

    def __init__(self, by: float) -> None:
        self.by, self.cache = by, {}

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: helper(act) + self.by)]

    def __lensprobe_identity__(self):
        return {"by": self.by} if self.VERSION is None else {"by": self.by, "version": self.VERSION}


def test_a_user_class_declaring_its_identity_without_a_version_is_refused_until_it_gives_one(tiny, tmp_path,
                                                                                              monkeypatch):
    folder = tmp_path / "run"
    cond = lp.Condition("own", interventions=(OwnIdentity(0.0),))
    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*OwnIdentity at condition 'own' interventions"
                                                r"\[0\]: its __lensprobe_identity__\(\) returns no 'version'.*user code"
                                                r".*\{'version': '1', \.\.\.\}.*lp.interventions.declare\(OwnIdentity, "
                                                r"name='OwnIdentity', version='1'\)"):
        run(tiny, [cond], folder)
    assert not folder.exists()  # refused before compute: nothing written
    assert len(run(tiny, [cond], None)) == 2  # kept in memory: nothing to reuse, no identity needed
    monkeypatch.setattr(OwnIdentity, "VERSION", "1")
    first = run(tiny, [cond], folder)
    before = snapshot(folder)
    monkeypatch.setattr(__import__(__name__), "SHIFT", 30.0)  # the helper now computes something else ...
    monkeypatch.setattr(OwnIdentity, "VERSION", "2")  # ... and the class says so
    with pytest.raises(lp.LensprobeError, match=r"already holds condition 'own' with a different definition:"
                                                r"\n.*version: folder has '1', this run has '2'"):
        run(tiny, [cond], folder)
    assert snapshot(folder) == before
    fresh = run(tiny, [cond], tmp_path / "fresh")
    assert generations(fresh) != generations(first)
    monkeypatch.setattr(OwnIdentity, "VERSION", None)  # no version, but the class declared: accepted
    monkeypatch.setattr(OwnIdentity, lp.core.storage.declared.DECLARED, ("own", "2"), raising=False)
    assert generations(run(tiny, [cond], tmp_path / "declared")) == generations(fresh)
    prompt = lp.build_prompt(tiny, "What?", template="raw")  # lensprobe's own class: its version is lensprobe's
    assert "version" not in prompt.__lensprobe_identity__() and lp.core.storage.identity.identity(prompt)[".identity"]


def test_weights_edited_through_data_are_another_model(tmp_path):
    model = tiny_model(seed=0)
    folder = tmp_path / "run"
    first = run(model, "w/o", folder)
    with torch.no_grad():
        model.original_model.get_input_embeddings().weight.data.mul_(0.5)  # bumps no version counter
    with pytest.raises(lp.LensprobeError, match=r"holds results of another 'evaluation' run:\n.*model.weights: "
                                                r"folder has '[0-9a-f]{16}', this run has '[0-9a-f]{16}'"):
        run(model, "w/o", folder)
    fresh = run(model, "w/o", tmp_path / "fresh")
    assert fresh["config_hash"].iloc[0] != first["config_hash"].iloc[0]
    assert generations(fresh) == generations(run(model, "w/o", None))


def test_a_changed_default_is_not_reused(tiny, tmp_path):
    @functools.partial(lp.interventions.declare, name="resid-shift", version="1")
    @dataclasses.dataclass(frozen=True)
    class ResidShift:
        by: float = 0.0

        def hooks(self, model):
            return [("blocks.0.hook_resid_post", lambda act, hook: act + self.by)]

    first = run(tiny, [lp.Condition("shift", interventions=(ResidShift(),))], tmp_path / "run")

    @functools.partial(lp.interventions.declare, name="resid-shift", version="1")
    @dataclasses.dataclass(frozen=True)
    class ResidShift:  # type: ignore[no-redef]  # the same class with a new default
        by: float = 30.0

        def hooks(self, model):
            return [("blocks.0.hook_resid_post", lambda act, hook: act + self.by)]

    cond = lp.Condition("shift", interventions=(ResidShift(),))
    with pytest.raises(lp.LensprobeError, match=r"different definition:\n.*by: folder has 0, this run has 30"):
        run(tiny, [cond], tmp_path / "run")
    fresh = run(tiny, [cond], tmp_path / "fresh")
    assert generations(fresh) != generations(first)


def test_the_same_template_text_with_other_tokens_is_another_condition(tiny, tmp_path):
    def raw(model, question):
        return lp.build_prompt(model, question, template="raw", add_special_tokens=True)  # the bridge's BOS

    def raw_bare(model, question):
        return lp.build_prompt(model, question, template="raw", add_special_tokens=False)

    with_bos, bare = raw(tiny, "What?"), raw_bare(tiny, "What?")
    assert with_bos.text == bare.text and len(with_bos) == len(bare) + 1  # same text, one token fewer
    run(tiny, [lp.Condition("raw", build=raw)], tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["parts"]["raw"]["template_tokens"]["count"] == len(raw(tiny, "{question}"))
    with pytest.raises(lp.LensprobeError, match=r"condition 'raw' with a different definition:\n"
                                                r"(.|\n)*template_tokens.count: folder has \d+, this run has \d+"):
        run(tiny, [lp.Condition("raw", build=raw_bare)], tmp_path / "run")
    fresh = run(tiny, [lp.Condition("raw", build=raw_bare)], tmp_path / "fresh")
    assert list(fresh["prompt_tokens"]) == [len(raw_bare(tiny, p.problem)) for p in PROBLEMS]


def test_a_finished_row_whose_prompt_now_tokenizes_otherwise_is_refused_on_resume(tiny, tmp_path, monkeypatch):
    def spelled(model, question):  # reads a global: questions change, the "{question}" template does not
        return lp.build_prompt(model, question.replace("1", "one") if SPELL else question)

    cond = lp.Condition("spelled", build=spelled)
    lp.evaluate(tiny, PROBLEMS[:1], [cond], out=tmp_path / "run", max_new_tokens=4, progress=False)
    monkeypatch.setattr(__import__(__name__), "SPELL", True)
    with pytest.raises(lp.LensprobeError, match=r"holds the row of condition 'spelled', problem 'q0', sample 0 with "
                                                r"prompt token ids '[0-9a-f]+' \(\d+ tokens\), but this run builds its "
                                                r"prompt as '[0-9a-f]+' \(\d+ tokens\).*delete that row's line"):
        run(tiny, [cond], tmp_path / "run")
    fresh = run(tiny, [cond], tmp_path / "fresh")
    assert "one+one" in fresh["prompt"].iloc[0]


def test_the_engine_is_recorded_in_the_settings_every_row_and_the_table(tiny, tmp_path):
    steered = lp.Condition("steered", interventions=(lp.interventions.declare(GlobalShift, name="g", version="1")(),))
    bridge = lp.Condition("w/o on the bridge", generate_kwargs={"engine": "bridge"})
    rows = run(tiny, ["w/o", steered, bridge], tmp_path)
    parts = json.loads((tmp_path / "config.json").read_text())["parts"]
    engines = {"w/o": "hf", "steered": "bridge", "w/o on the bridge": "bridge"}  # auto resolved, never "auto"
    assert {name: part["engine"] for name, part in parts.items()} == engines
    assert dict(zip(rows["condition"], rows["engine"], strict=True)) == engines
    assert dict(zip(lp.evals.load_results(tmp_path)["condition"], lp.evals.load_results(tmp_path)["engine"],
                    strict=True)) == engines
    assert parts["w/o"]["hash"] != parts["w/o on the bridge"]["hash"]


def test_a_sweep_with_an_undeclared_metric_is_refused_before_compute(tiny, tmp_path):
    prompt = lp.build_prompt(tiny, "What is 2+2?")

    def metric(logits, prompt):
        return logits[:, -1].float().log_softmax(-1)[:, 3]

    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*metric.*user code.*lp.interventions.declare"):
        lp.ablation_sweep(tiny, prompt, metric, heads=["L0H0"], progress=False, out=tmp_path / "sweep")
    assert not (tmp_path / "sweep" / "config.json").exists()
    kept = lp.ablation_sweep(tiny, prompt, metric, heads=["L0H0"], progress=False)
    declared = lp.ablation_sweep(tiny, prompt, lp.interventions.declare(metric, name="logprob-3", version="1"),
                                 heads=["L0H0"], progress=False, out=tmp_path / "sweep")
    assert torch.equal(kept.ablated, declared.ablated) and torch.equal(kept.baseline, declared.baseline)
