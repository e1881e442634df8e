"""The evaluation harness on the tiny model: batching, oracles, resuming, SIGKILL, sharding, CLI."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.evals import Problem, builtin_condition, load_results
from lensprobe.evals.results.folder import read_rows
from lensprobe.prompts import Condition

VENV_BIN = Path(sys.executable).parent
QUESTIONS = [
    "What is 1+1?",
    "Compute 12 * 3 and give the answer.",
    "What is the sum of the first ten positive integers? Answer with a number.",
    "Solve for x: 2x + 3 = 7.",
    "What is 7?",
    "If a square has side 4, what is its area?",
    "What is 3/4 as a decimal?",
    "How many sides does a hexagon have?",
    "What is 10 - 4?",
    "Find the value of 5 squared.",
    "What is 100 divided by 4?",
    "What is 2 to the power 5?",
]
# Columns that depend on timing or on which process wrote the row.
VOLATILE = ["seconds", "rank", "config_hash"]  # the run's hash holds its batch size


def problems(n=None):
    return [Problem(id=f"q{i}", problem=q, answer=str(i), level=1 + i % 3, subject="S" if i % 2 else "T")
            for i, q in enumerate(QUESTIONS[:n] if n else QUESTIONS)]


def write_problems(path: Path, n=None) -> Path:
    rows = [{"problem": p.problem, "answer": p.answer, "level": p.level, "subject": p.subject, "unique_id": p.id}
            for p in problems(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def stable(df):
    return df.drop(columns=VOLATILE).reset_index(drop=True)


def hf_greedy(hf, model, prompt, max_new_tokens):
    """Oracle: greedy transformers generate on ``hf``, a separately built plain model with ``model``'s weights."""
    out = hf.generate(prompt.tokens, attention_mask=torch.ones_like(prompt.tokens), max_new_tokens=max_new_tokens,
                      do_sample=False, eos_token_id=model.tokenizer.eos_token_id,
                      pad_token_id=model.tokenizer.pad_token_id)
    return out[0, prompt.tokens.shape[1]:].tolist()


def test_batched_equals_unbatched_and_transformers(tiny, tiny_hf):
    probs = problems(6)
    one = lp.evaluate(tiny, probs, "w/o,w/ Mless", max_new_tokens=20, batch_size=1, progress=False)
    many = lp.evaluate(tiny, probs, "w/o,w/ Mless", max_new_tokens=20, batch_size=4, progress=False)
    assert len(one) == 12 and set(one["prompt_tokens"].iloc[:6]) != {one["prompt_tokens"].iloc[0]}
    assert stable(one).equals(stable(many))
    # Oracle: every row's generation is what transformers' greedy generate produces.
    for cname in ("w/o", "w/ Mless"):
        build = builtin_condition(cname).prompt_builder(tiny)
        for p in probs[:3]:
            ids = hf_greedy(tiny_hf, tiny, build(p.problem), 20)
            row = many[(many["condition"] == cname) & (many["problem_id"] == p.id)].iloc[0]
            eos = tiny.tokenizer.eos_token_id
            body = ids[:-1] if ids[-1] == eos and len(ids) < 20 else ids
            assert row["generation"] == tiny.tokenizer.decode(body)
            assert row["generated_tokens"] == len(ids)
            # the chat-format prompt, rendered by the chat template: filler between system prompt and question
            user = p.problem if cname == "w/o" else " ".join(["/"] * 55) + "\n" + p.problem
            messages = [{"role": "system", "content": lp.MATH_SYSTEM_PROMPT}, {"role": "user", "content": user}]
            assert row["prompt"] == tiny.tokenizer.apply_chat_template(messages, tokenize=False,
                                                                       add_generation_prompt=True)


@dataclass(frozen=True)
@functools.partial(lp.interventions.declare, name="scripted-answer", version="1")
class ScriptedAnswer:
    """Makes the model write the token ids ``script`` and then the end-of-sequence token."""
    script: tuple[int, ...]
    eos: int

    def hooks(self, model):
        def boost(logits, hook):
            info = hook.step
            if info is None:
                return None
            logits = logits.clone()
            for b, t in enumerate(info.steps.tolist()):  # each row at its own step (continuous batching)
                logits[b, -1, self.script[t] if t < len(self.script) else self.eos] += 1e4
            return logits

        return [("hook_unembed", boost)]


def test_rows_hold_prompt_grades_and_hashes(tiny, tmp_path):
    probs = problems(3)  # answers "0", "1", "2"
    text = r" so the answer is $\boxed{1}$"
    script = tuple(tiny.tokenizer.encode(text, add_special_tokens=False))
    assert tiny.tokenizer.decode(list(script)) == text
    cond = Condition("w/o, answers 1", interventions=(ScriptedAnswer(script, tiny.tokenizer.eos_token_id),))
    df = lp.evaluate(tiny, probs, [cond], out=tmp_path, max_new_tokens=len(script) + 4, progress=False,
                     model_name="tiny")
    assert list(df["problem_id"]) == ["q0", "q1", "q2"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (df["config_hash"] == cfg["hash"]).all()
    assert (df["condition_hash"] == cfg["parts"][cond.name]["hash"]).all()
    template = cfg["parts"][cond.name]["prompt_template"]
    assert [template.replace("{question}", p.problem) for p in probs] == list(df["prompt"])
    # every row wrote the scripted answer and stopped; only the problem whose answer is 1 is right
    assert list(df["generation"]) == [text] * 3 and list(df["finish"]) == ["eos"] * 3
    assert list(df["generated_tokens"]) == [len(script) + 1] * 3
    assert list(df["prediction"]) == ["1"] * 3
    for grader in ("math-verify", "paper", "paper-lenient"):
        assert list(df[grader]) == [False, True, False], grader


def test_row_grades_the_generated_text_only(tiny):
    from lensprobe.evals.running.execute import Item, RunInfo, make_row

    p = Problem(id="x", problem="What is 3+4?", answer="7")
    cond = builtin_condition("w/o")
    prompt = cond.prompt_builder(tiny)(p.problem)
    assert "\\boxed{}" in prompt.text  # the system prompt's empty box is never graded
    info = RunInfo("m", "h", {"w/o": "c"}, 0)
    row = make_row(Item(p, 0, prompt), cond, [1, 2, 3], r"3+4 = 7, so $\boxed{7}$.", "eos", 0.1, info)
    assert (row["prediction"], row["math-verify"], row["paper"], row["paper-lenient"]) == ("7", True, True, True)
    row = make_row(Item(p, 0, prompt), cond, [1], "I think it is 7.", "length", 0.1, info)
    assert row["prediction"] is None and not row["math-verify"] and not row["paper-lenient"]
    assert row["prompt"] == prompt.text and row["generated_tokens"] == 1 and row["finish"] == "length"


def test_resume_skips_finished_rows_and_extends(tiny, tmp_path):
    probs = problems(6)
    first = lp.evaluate(tiny, probs[:3], "w/o,w/ Mful", out=tmp_path, max_new_tokens=8, progress=False)
    size = (tmp_path / "results-rank0.jsonl").stat().st_size
    again = lp.evaluate(tiny, probs[:3], "w/o,w/ Mful", out=tmp_path, max_new_tokens=8, progress=False)
    assert (tmp_path / "results-rank0.jsonl").stat().st_size == size  # nothing regenerated
    assert stable(first).equals(stable(again))
    more = lp.evaluate(tiny, probs, "w/o,w/ Mful", out=tmp_path, max_new_tokens=8, progress=False)
    assert len(more) == 12 and len(read_rows(tmp_path)) == 12
    fresh = lp.evaluate(tiny, probs, "w/o,w/ Mful", max_new_tokens=8, progress=False)
    assert stable(more).equals(stable(fresh))
    # a new condition joins the folder; another setting is refused
    lp.evaluate(tiny, probs[:2], "w/ Mless", out=tmp_path, max_new_tokens=8, progress=False)
    assert len(load_results(tmp_path)) == 14
    with pytest.raises(lp.LensprobeError, match=r"another 'evaluation' run:\n  generation\.max_new_tokens: folder has 8, this run has 9"):
        lp.evaluate(tiny, probs, "w/o", out=tmp_path, max_new_tokens=9, progress=False)
    other = Condition("w/o", system="Another system prompt.")
    with pytest.raises(lp.LensprobeError, match="different definition"):
        lp.evaluate(tiny, probs, [other], out=tmp_path, max_new_tokens=8, progress=False)
    changed = [replace(probs[0], answer="99")]
    with pytest.raises(lp.LensprobeError, match="different problem"):
        lp.evaluate(tiny, changed, "w/o", out=tmp_path, max_new_tokens=8, progress=False)
    with pytest.raises(lp.LensprobeError, match="resume is off"):
        lp.evaluate(tiny, probs, "w/o", out=tmp_path, max_new_tokens=8, progress=False, resume=False)
    # a different model is another configuration
    with pytest.raises(lp.LensprobeError, match=r"another 'evaluation' run:\n  model\."):
        lp.evaluate(tiny_model(seed=1), probs, "w/o", out=tmp_path, max_new_tokens=8, progress=False)


def test_progress_bar_shows_rate_and_running_accuracy(tiny, capsys):
    lp.evaluate(tiny, problems(2), "w/o,w/ Mful", max_new_tokens=4, progress=True)
    err = capsys.readouterr().err
    assert "problem/s" in err and "acc w/o 0%" in err and "w/ Mful 0%" in err and "4/4" in err


def test_bad_settings(tiny, tmp_path):
    probs = problems(2)
    with pytest.raises(lp.LensprobeError, match="unknown condition"):
        lp.evaluate(tiny, probs, "w/o,w/ Mores", max_new_tokens=4, progress=False)
    with pytest.raises(lp.LensprobeError, match="identical"):
        lp.evaluate(tiny, probs, "w/o", max_new_tokens=4, n_samples=3, progress=False)
    with pytest.raises(lp.LensprobeError, match="leaves no room for a prompt"):
        lp.evaluate(tiny, probs, "w/o", max_new_tokens=int(tiny.cfg.n_ctx), progress=False)
    with pytest.raises(lp.LensprobeError, match="max_new_tokens"):
        lp.evaluate(tiny, probs, "w/o", max_new_tokens=0, progress=False)
    with pytest.raises(lp.LensprobeError, match="no problems"):
        lp.evaluate(tiny, [], "w/o", max_new_tokens=4, progress=False)
    with pytest.raises(lp.LensprobeError, match="appears twice"):
        lp.evaluate(tiny, [probs[0], probs[0]], "w/o", max_new_tokens=4, progress=False)


def test_sampling_rows_do_not_depend_on_batching(tiny, tmp_path):
    probs = problems(3)
    kw = dict(max_new_tokens=10, do_sample=True, n_samples=3, seed=5, progress=False)
    a = lp.evaluate(tiny, probs, "w/o", batch_size=1, **kw)
    b = lp.evaluate(tiny, probs, "w/o", batch_size=9, **kw)
    assert list(a["sample"]) == [0, 1, 2] * 3
    assert stable(a).equals(stable(b))
    assert a["generation"].nunique() > 3  # the samples differ
    # resuming a half-finished sampled run reproduces the same samples
    half = lp.evaluate(tiny, probs[:2], "w/o", out=tmp_path, batch_size=2, **kw)
    full = lp.evaluate(tiny, probs, "w/o", out=tmp_path, batch_size=2, **kw)
    assert stable(full).equals(stable(a)) and stable(half).equals(stable(a).iloc[:6])


def test_head_ablation_condition_matches_zeroed_head_in_transformers(tiny, tiny_hf):
    probs = problems(3)
    layer, head = 1, 2
    from lensprobe.interventions.ablation import ablate_heads

    cond = Condition("w/o, L1H2 ablated", interventions=(ablate_heads([(layer, head)]),))
    df = lp.evaluate(tiny, probs, ["w/o", cond], max_new_tokens=16, batch_size=3, progress=False)
    # Oracle: zero that head's slice of the o_proj input in the plain HF model.
    hf = tiny_hf
    d_head = tiny.cfg.d_head
    attn = hf.model.layers[layer].self_attn

    def zero_head(module, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    handle = attn.o_proj.register_forward_pre_hook(zero_head)
    try:
        build = cond.prompt_builder(tiny)
        expected = [hf_greedy(hf, tiny, build(p.problem), 16) for p in probs]
    finally:
        handle.remove()
    rows = df[df["condition"] == cond.name]
    assert list(rows["generated_tokens"]) == [len(ids) for ids in expected]
    eos = tiny.tokenizer.eos_token_id
    for ids, text in zip(expected, rows["generation"], strict=True):
        assert text == tiny.tokenizer.decode(ids[:-1] if ids[-1] == eos and len(ids) < 16 else ids)
    assert not rows["generation"].reset_index(drop=True).equals(
        df[df["condition"] == "w/o"]["generation"].reset_index(drop=True))


def test_latent_thinking_condition_is_passed_to_generation():
    from lensprobe.generation.loop import generate
    from lensprobe.generation.thinking import schedule
    from lensprobe.generation.thinking.latent import Pause, add_thinking_token

    model = tiny_model(seed=3)
    add_thinking_token(model, "<thinking>")
    probs = problems(2)
    kwargs = {"thinking": Pause(), "think_when": schedule.every(3)}
    cond = Condition("pause every 3", generate_kwargs=kwargs)
    df = lp.evaluate(model, probs, [cond], max_new_tokens=12, progress=False)
    build = cond.prompt_builder(model)
    direct = generate(model, [build(p.problem) for p in probs], max_new_tokens=12, **kwargs)
    assert list(df["generation"]) == direct.texts
    plain = lp.evaluate(model, probs, "w/o", max_new_tokens=12, progress=False)
    assert list(plain["generation"]) != list(df["generation"])  # thinking steps changed the answers
    assert cond.describe(model)["generate_kwargs"]["think_when"]["period"] == 3


def test_shards_in_process_merge_to_the_single_run(tiny, tmp_path, monkeypatch):
    from lensprobe.evals import shard_info

    probs = problems(5)
    kw = dict(max_new_tokens=6, progress=False, model_name="tiny")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert shard_info() == (1, 2)
    part = lp.evaluate(tiny, probs, "w/o", out=tmp_path, **kw)  # rank 1 from the MPI variables
    assert list(part["problem_id"]) == ["q1", "q3"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    merged = lp.evaluate(tiny, probs, "w/o", out=tmp_path, **kw)  # rank 0 (torchrun variables win)
    single = lp.evaluate(tiny, probs, "w/o", rank=0, world_size=1, **kw)
    assert stable(merged).equals(stable(single))
    assert {r["rank"] for r in read_rows(tmp_path)} == {0, 1}
    with pytest.raises(lp.LensprobeError, match="needs an output folder"):
        lp.evaluate(tiny, probs, "w/o", **kw)
    with pytest.raises(lp.LensprobeError, match="bad shard"):
        lp.evaluate(tiny, probs, "w/o", out=tmp_path, rank=2, world_size=2, **kw)


def test_rank_0_names_the_ranks_that_stall_and_keeps_its_rows(tiny, tmp_path, monkeypatch):
    """The results store's one wait: when the other ranks stall, rank 0 of an evaluation stops with an
    error naming them, their problems and the fix (as sweeps do); its own rows stay, and once the other
    rank has run, the same command returns the merged table without generating anything again."""
    monkeypatch.setenv("LENSPROBE_STALL_TIMEOUT", "0.2")  # the limit every wait reads (stall_limit)
    probs = problems(5)
    kw = dict(max_new_tokens=6, progress=False, model_name="tiny", world_size=2)
    with pytest.raises(lp.LensprobeError, match=r"rank 1 of 2 did not finish 2 problem\(s\) \(e.g. 'q1'\) .*"
                                                r"rerun the same command: it resumes"):
        lp.evaluate(tiny, probs, "w/o", out=tmp_path, rank=0, **kw)
    assert [r["problem_id"] for r in read_rows(tmp_path)] == ["q0", "q2", "q4"]  # nothing lost
    lp.evaluate(tiny, probs, "w/o", out=tmp_path, rank=1, **kw)
    size = (tmp_path / "results-rank0.jsonl").stat().st_size
    merged = lp.evaluate(tiny, probs, "w/o", out=tmp_path, rank=0, **kw)
    assert (tmp_path / "results-rank0.jsonl").stat().st_size == size  # rank 0 generated nothing again
    single = lp.evaluate(tiny, probs, "w/o", max_new_tokens=6, progress=False, model_name="tiny")
    assert stable(merged).equals(stable(single))


def test_smol_batched_equals_unbatched_and_transformers(smol, smol_hf, math500_path):
    probs = lp.load_math500(math500_path, levels=1, limit=2)
    assert len(probs[0].problem) != len(probs[1].problem)  # different lengths: the batch is padded
    one = lp.evaluate(smol, probs, "w/ Mless", max_new_tokens=16, batch_size=1, progress=False)
    many = lp.evaluate(smol, probs, "w/ Mless", max_new_tokens=16, batch_size=2, progress=False)
    cols = ["condition", "problem_id", "generation", "generated_tokens", "finish", "prediction", "math-verify"]
    assert one[cols].equals(many[cols])
    # Oracle: transformers' greedy generate on the same prompt.
    prompt = builtin_condition("w/ Mless").prompt_builder(smol)(probs[1].problem)
    out = smol_hf.generate(prompt.tokens, attention_mask=torch.ones_like(prompt.tokens), max_new_tokens=16,
                           do_sample=False, eos_token_id=smol.tokenizer.eos_token_id,
                           pad_token_id=smol.tokenizer.pad_token_id)
    ids = out[0, prompt.tokens.shape[1]:].tolist()
    row = many[(many["condition"] == "w/ Mless") & (many["problem_id"] == probs[1].id)].iloc[0]
    assert row["generated_tokens"] == len(ids)
    assert row["generation"] == smol.tokenizer.decode(ids[:-1] if row["finish"] == "eos" else ids)


def _wait_for_rows(path: Path, n: int, proc, timeout=120.0) -> int:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if path.exists():
            count = path.read_bytes().count(b"\n")
            if count >= n:
                return count
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    raise AssertionError("no rows appeared in time")


RUN_SCRIPT = """
import sys
import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
model = tiny_model(seed=0)
lp.evaluate(model, lp.load_math500(sys.argv[1]), "w/o,w/ Mless,w/ Mful", out=sys.argv[2],
            max_new_tokens=60, batch_size=1, progress=False, model_name="tiny")
"""


@pytest.mark.slow  # launches a process that evaluates 36 rows
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tiny, tmp_path):
    data = write_problems(tmp_path / "probs.jsonl")
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", RUN_SCRIPT, str(data), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_rows(out / "results-rank0.jsonl", 4, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    total = 3 * len(QUESTIONS)
    survived = len(read_rows(out))
    assert 4 <= survived < total, f"{survived} rows survived: the kill should land mid-run"
    probs = lp.load_math500(data)
    resumed = lp.evaluate(tiny, probs, "w/o,w/ Mless,w/ Mful", out=out, max_new_tokens=60, batch_size=1,
                          progress=False, model_name="tiny")  # the folder's batch size (part of its identity)
    rows = read_rows(out)
    keys = [(r["condition"], r["problem_id"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == total  # no duplicates, nothing lost
    clean = lp.evaluate(tiny, probs, "w/o,w/ Mless,w/ Mful", out=tmp_path / "clean", max_new_tokens=60,
                        batch_size=4, progress=False, model_name="tiny")
    assert stable(resumed).equals(stable(clean))
    assert stable(load_results(out)).equals(stable(load_results(tmp_path / "clean")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [str(VENV_BIN / "accelerate"), "launch", *args, "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(_free_port()), "-m", "lensprobe.app.cli"]
    return cmd, env


@pytest.mark.slow  # launches accelerate (two processes, then one)
def test_accelerate_two_processes_give_the_same_rows_as_one(tiny, tmp_path):
    data = write_problems(tmp_path / "probs.jsonl", 7)
    out = tmp_path / "sharded"
    eval_args = ["eval", "--model", "tiny", "--data", str(data), "--conditions", "w/o,w/ Mless",
                 "--max-new-tokens", "12", "--batch-size", "3", "--out", str(out), "--no-progress"]
    # On a CPU-only machine accelerate starts several local processes through its torchrun
    # launcher (--multi_gpu); `--cpu` alone starts one process unless an MPI hostfile is given.
    cmd, env = _accelerate(["--multi_gpu", "--num_processes", "2"], tmp_path)
    res = subprocess.run(cmd + eval_args, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rank_rows = {r: read_rows_file(out / f"results-rank{r}.jsonl") for r in (0, 1)}
    probs = lp.load_math500(data)
    assert {row["problem_id"] for row in rank_rows[0]} == {p.id for p in probs[0::2]}
    assert {row["problem_id"] for row in rank_rows[1]} == {p.id for p in probs[1::2]}
    assert "w/ Mless" in res.stdout and "McNemar" in res.stdout  # rank 0 printed the merged summary
    assert (out / "report" / "index.html").is_file()
    single = lp.evaluate(tiny, probs, "w/o,w/ Mless", max_new_tokens=12, batch_size=3, progress=False,
                         model_name="tiny")
    assert stable(load_results(out)).equals(stable(single))
    # the literal CPU launch works too (one process here) and resumes the same folder
    cmd, env = _accelerate(["--cpu", "--num_processes", "2"], tmp_path)
    res = subprocess.run(cmd + eval_args, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(read_rows(out)) == 14


def read_rows_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_cli_eval_and_eval_report(tmp_path, capsys):
    from lensprobe.app.cli import main

    data = write_problems(tmp_path / "probs.jsonl", 4)
    out = tmp_path / "run"
    argv = ["eval", "--model", "tiny", "--data", str(data), "--conditions", "w/o,w/ Mful", "--levels", "1,2",
            "--max-new-tokens", "6", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "w/ Mful vs w/o" in text and "McNemar exact p" in text
    df = load_results(out)
    assert len(df) == 2 * sum(p.level in (1, 2) for p in problems(4))
    assert main(["eval-report", str(out), "--out", str(tmp_path / "rep"), "--grader", "paper"]) == 0
    capsys.readouterr()
    assert (tmp_path / "rep" / "index.html").is_file()
    csvs = {p.name for p in (tmp_path / "rep").rglob("*.csv")}
    assert {"accuracy.csv", "by-level.csv", "by-subject.csv", "comparisons.csv"} <= csvs
    # bad input: exit code 2 and a one-line reason
    assert main(argv[:-3] + ["--conditions", "w/o,bogus", "--out", str(out), "--no-progress"]) == 2
    assert "unknown condition 'bogus'" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny", "--data", str(data), "--max-new-tokens", "7", "--out", str(out),
                 "--conditions", "w/o", "--no-progress"]) == 2
    assert "another 'evaluation' run" in capsys.readouterr().err
    # --ablate-heads adds an ablated copy of every condition
    abl = tmp_path / "abl"
    assert main(["eval", "--model", "tiny", "--data", str(data), "--conditions", "w/o", "--ablate-heads", "L0H1",
                 "--max-new-tokens", "4", "--out", str(abl), "--no-progress"]) == 0
    assert list(dict.fromkeys(load_results(abl)["condition"])) == ["w/o", "w/o [ablate L0H1]"]
    assert "HeadAblation" in (abl / "config.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x", "answer": "1"}\n{oops\n', encoding="utf-8")
    assert main(["eval", "--model", "tiny", "--data", str(bad), "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert "line 2" in capsys.readouterr().err
