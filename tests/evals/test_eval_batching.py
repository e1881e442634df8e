"""Evaluations under continuous batching: rows as if generated alone, written as they finish,
error rows for rows that cannot run (retried on resume), and a clean stop on Ctrl-C."""

import functools
import json
import re
import warnings
from dataclasses import dataclass, field

import pytest
import torch

import lensprobe as lp
from lensprobe.evals import Problem, load_results
from lensprobe.evals.results.folder import read_rows, results_file
from lensprobe.evals.running.harness import ErrorRowsWarning
from lensprobe.prompts import Condition

QUESTIONS = ["What is 1+1?", "Compute 12 * 3 and give the answer, showing every step of the work.",
             "Hi?", "Solve for x: 2x + 3 = 7, then check the solution by substituting it back.",
             "What is 7?", "If a square has side 4, what is its area?"]
VOLATILE = ["seconds", "rank", "config_hash"]  # the run's hash holds its batch size


def problems(n=None):
    qs = QUESTIONS[:n] if n else QUESTIONS
    return [Problem(id=f"q{i}", problem=q, answer=str(i)) for i, q in enumerate(qs)]


def stable(df):
    return df.drop(columns=VOLATILE).reset_index(drop=True)


def test_rows_are_the_same_at_every_batch_size_and_come_back_in_problem_order(tiny):
    """Continuous batching (batch 2 of 6 rows, rows finishing at different steps) gives each row
    what it gets alone (batch 1, each problem generated on its own)."""
    run = dict(max_new_tokens=12, progress=False)
    alone = lp.evaluate(tiny, problems(), "w/o,w/ Mless", batch_size=1, **run)
    refill = lp.evaluate(tiny, problems(), "w/o,w/ Mless", batch_size=2, **run)
    assert stable(alone).equals(stable(refill))
    assert list(refill["problem_id"][:6]) == [p.id for p in problems()]
    lengths = set(refill["generated_tokens"])
    assert len(set(refill["prompt_tokens"])) > 2 and len(lengths) >= 1
    sampled = dict(run, do_sample=True, n_samples=2, seed=5)
    a = lp.evaluate(tiny, problems(4), "w/o", batch_size=1, **sampled)
    b = lp.evaluate(tiny, problems(4), "w/o", batch_size=3, **sampled)
    assert stable(a).equals(stable(b)) and list(a["sample"]) == [0, 1] * 4


def test_rows_are_written_as_they_finish_and_seconds_add_up(tiny, tmp_path, monkeypatch):
    """Each row is on disk (synced) before the next one finishes, in the order rows end."""
    from lensprobe.evals.results import folder as results_module

    on_disk_when_written = []
    real_write = results_module.RowWriter.write

    def write(self, row):
        on_disk_when_written.append(len(read_rows(tmp_path)))
        return real_write(self, row)

    monkeypatch.setattr(results_module.RowWriter, "write", write)
    caps = lp.evaluate(tiny, problems(), "w/o", out=tmp_path, max_new_tokens=10, batch_size=2, progress=False,
                       stop_at_eos=False)
    assert on_disk_when_written == list(range(6))  # row k was written after rows 0..k-1 were on disk
    assert caps["seconds"].sum() > 0 and (caps["seconds"] >= 0).all()


@functools.partial(lp.interventions.declare, name="fail-for", version="1")
@dataclass
class FailFor:
    """An intervention whose hook refuses (LensprobeError) the prompt forward of prompts of
    ``length`` tokens while ``armed``; ``raise_as`` changes what it raises."""

    length: int
    armed: list = field(default_factory=lambda: [True], metadata={"identity": False})  # the test's switch
    raise_as: type = lp.LensprobeError

    def hooks(self, model):
        def hook(x, hook):
            info = hook.step
            if self.armed[0] and info is not None and info.step == 0 and self.length in info.prompt_lengths.tolist():
                raise self.raise_as("this prompt cannot run here")
            return None

        return [("blocks.0.hook_resid_post", hook)]

    def __repr__(self) -> str:  # part of the condition's hash: must not change when disarmed
        return f"FailFor({self.length})"


def test_a_row_that_cannot_run_is_an_error_row_and_the_others_go_on(tiny, tmp_path):
    probs = problems()
    build = lp.evals.builtin_condition("w/o").prompt_builder(tiny)
    victim = len(build(probs[3].problem))
    assert sum(len(build(p.problem)) == victim for p in probs) == 1
    failing = FailFor(victim)
    cond = Condition("w/o, one fails", interventions=(failing,))
    with pytest.warns(ErrorRowsWarning, match=r"1 row\(s\) could not run .* problem 'q3': "
                                              r"the prompt forward failed: LensprobeError: this prompt cannot run"):
        rows = lp.evaluate(tiny, probs, cond, out=tmp_path, max_new_tokens=8, batch_size=2, progress=False)
    bad = rows[rows["problem_id"] == "q3"].iloc[0]
    assert bad["finish"] == "error" and bad["prediction"] is None and bad["math-verify"] is None
    assert "cannot run here" in bad["error"] and bad["generated_tokens"] == 0
    clean = lp.evaluate(tiny, probs, "w/o", max_new_tokens=8, batch_size=1, progress=False)
    ok = rows[rows["problem_id"] != "q3"]
    assert list(ok["generation"]) == list(clean[clean["problem_id"] != "q3"]["generation"])
    assert ok["error"].isna().all()
    # resumed: the error row is tried again; now it runs and replaces the error row everywhere
    failing.armed[0] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", ErrorRowsWarning)
        again = lp.evaluate(tiny, probs, cond, out=tmp_path, max_new_tokens=8, batch_size=2, progress=False)
    assert len(read_rows(tmp_path)) == 7  # 6 rows, then the retried one
    for table in (again, load_results(tmp_path)):
        assert len(table) == 6 and "error" not in set(table["finish"])
        assert list(table["generation"]) == list(clean["generation"])


def test_a_bug_in_an_intervention_stops_the_run_and_keeps_the_finished_rows(tiny, tmp_path):
    """Only row faults (lensprobe refusing an input, out of memory) become error rows; a bug does not."""
    build = lp.evals.builtin_condition("w/o").prompt_builder(tiny)
    cond = Condition("w/o, bug", interventions=(FailFor(len(build(QUESTIONS[4])), raise_as=ZeroDivisionError),))
    with pytest.raises(ZeroDivisionError, match="cannot run here"):
        lp.evaluate(tiny, problems(), cond, out=tmp_path, max_new_tokens=6, batch_size=2, progress=False)
    assert all(r["finish"] != "error" for r in read_rows(tmp_path))


def test_a_prompt_too_long_for_the_context_is_an_error_row(tiny):
    long = Problem(id="long", problem=" ".join(["word"] * 240), answer="0")
    probs = [*problems(3), long]
    with pytest.warns(ErrorRowsWarning, match=r"problem 'long': prompt is \d+ tokens but the model's context is 256"):
        rows = lp.evaluate(tiny, probs, "w/o", max_new_tokens=8, batch_size=2, progress=False)
    assert list(rows["finish"] == "error") == [False, False, False, True]
    # a prompt that fits, but not with max_new_tokens: refused by the generation, also an error row
    build = lp.evals.builtin_condition("w/o").prompt_builder(tiny)
    short = Problem(id="short", problem=" ".join(["word"] * 40), answer="0")
    room = int(tiny.cfg.n_ctx) - len(build(short.problem))
    assert 8 < room + 8 < 250
    with pytest.warns(ErrorRowsWarning, match=r"problem 'short': prompt \(\d+ tokens\) \+ max_new_tokens "
                                              r"\(\d+\) = \d+ exceeds the model's context of 256 tokens"):
        rows = lp.evaluate(tiny, [*problems(3), short], "w/o", max_new_tokens=room + 8, batch_size=2, progress=False)
    assert list(rows["finish"] == "error") == [False, False, False, True]
    alone = lp.evaluate(tiny, problems(3), "w/o", max_new_tokens=room + 8, batch_size=1, progress=False)
    assert list(rows["generation"][:3]) == list(alone["generation"])


@functools.partial(lp.interventions.declare, name="interrupt-after", version="1")
@dataclass
class InterruptAfter:
    """Raises KeyboardInterrupt in the forward after ``n`` decode forwards (as Ctrl-C would)."""

    n: int
    seen: list = field(default_factory=lambda: [0], metadata={"identity": False})  # a counter, not a setting

    def hooks(self, model):
        def hook(x, hook):
            info = hook.step
            if info is not None and info.step > 0:
                self.seen[0] += 1
                if self.seen[0] == self.n:
                    raise KeyboardInterrupt
            return None

        return [("blocks.0.hook_resid_post", hook)]

    def __repr__(self) -> str:
        return "InterruptAfter"


def test_ctrl_c_stops_cleanly_with_every_finished_row_written_and_the_rerun_completes(tiny, tmp_path):
    cond = Condition("w/o, interrupted", interventions=(InterruptAfter(14),))
    run = dict(out=tmp_path, max_new_tokens=6, batch_size=2, progress=False, stop_at_eos=False)
    reported = []
    with pytest.raises(KeyboardInterrupt):
        lp.evaluate(tiny, problems(), cond, **run)
    written = read_rows(tmp_path)
    assert 0 < len(written) < 6  # some rows had finished, not all
    lines = results_file(tmp_path, 0).read_text().splitlines()
    assert len(lines) == len(written) and all(json.loads(line) for line in lines)  # whole rows only
    reported = {r["problem_id"] for r in written}
    assert not tiny.hook_dict["blocks.0.hook_resid_post"].fwd_hooks  # the hook is gone
    full = lp.evaluate(tiny, problems(), cond, **run)  # the counter is past n now: no second interrupt
    assert len(full) == 6 and len(read_rows(tmp_path)) == 6  # only the missing rows ran again
    alone = lp.evaluate(tiny, problems(), "w/o", max_new_tokens=6, batch_size=1, progress=False, stop_at_eos=False)
    assert list(full["generation"]) == list(alone["generation"])
    assert reported <= set(full["problem_id"])


@pytest.mark.parametrize("settings", [dict(batch_size=4), dict(batch_size=8, do_sample=True, n_samples=4)],
                         ids=["greedy", "sampling"])
def test_each_generation_call_keeps_its_batch_busy_and_conditions_take_turns(tiny, monkeypatch, settings):
    """Every call hands lp.generate at least 8 rows per live row (the last of a run may hold fewer),
    and the conditions take turns chunk by chunk, so a stopped run has every condition's first rows."""
    from lensprobe.evals.running import execute as running

    calls = []
    monkeypatch.setattr(running, "_generate", lambda model, facts, batch, interventions, cond, config, batch_size, emit, engine:
                        calls.append((cond.name, len(batch), batch_size)))
    probs = lp.evals.arithmetic_problems(n=150, seed=0)
    lp.evaluate(tiny, probs, "w/o,w/ Mless", max_new_tokens=2, progress=False, **settings)
    rows = 150 * settings.get("n_samples", 1)
    b = settings["batch_size"]
    assert [name for name, _, _ in calls] == ["w/o", "w/ Mless"] * (len(calls) // 2) and len(calls) >= 4
    for name in ("w/o", "w/ Mless"):
        sizes = [n for c, n, _ in calls if c == name]
        assert sum(sizes) == rows and all(n >= 8 * b for n in sizes[:-1])
    assert {size for _, _, size in calls} == {b}


@pytest.mark.unchecked
def test_batch_size_is_checked(tiny):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(lp.LensprobeError, match="batch_size: expected a whole number"):
            lp.evaluate(tiny, problems(2), "w/o", max_new_tokens=4, batch_size=bad, progress=False)
    big = lp.evaluate(tiny, problems(2), "w/o", max_new_tokens=4, batch_size=100, progress=False)
    assert len(big) == 2 and torch.tensor(big["generated_tokens"].tolist()).min() >= 1


def test_cli_counts_error_rows_and_says_how_to_resume_after_ctrl_c(tmp_path, capsys, monkeypatch):
    from lensprobe.app import cli
    from lensprobe.app.commands import evals as commands

    data = tmp_path / "p.jsonl"
    rows = [{"problem": q, "answer": "1"} for q in QUESTIONS[:3]] + [{"problem": " ".join(["word"] * 240), "answer": "0"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    argv = ["eval", "--model", "tiny", "--data", str(data), "--conditions", "w/o", "--max-new-tokens", "4",
            "--batch-size", "2", "--out", str(tmp_path / "run"), "--no-progress"]
    with pytest.warns(ErrorRowsWarning, match="1 row"):
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"w/o +[\d.]+% +\[.*\] +\(\d/3\)", out)  # three rows graded, the error row left out
    assert "1 row(s) could not run and are left out of the accuracy" in out
    assert "prompt is" in out and "rerun the same command to retry them" in out

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "evaluate", interrupted)
    assert cli.main(argv[:-3] + ["--out", str(tmp_path / "other"), "--no-progress"]) == 130
    assert "interrupted; every finished row is saved in --out; rerun the same command to resume" in \
        capsys.readouterr().err
