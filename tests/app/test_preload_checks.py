"""Every command-line value is checked before the model loads: each bad value below exits with code 2,
one line that names the argument, and no model loaded. One row per (command, flag): a new flag gets
its row here."""

import shlex

import pytest

import lensprobe as lp
from lensprobe.app import common
from lensprobe.app.cli import main, write_error_log

BASE = {  # eval: --problems math500 (the default) when --data is in the row
    "attention": "attention --model tiny --question 'What is 2+3?' --out out",
    "eval": "eval --model tiny --problems arithmetic --limit 2 --out out",
    "eval-report": "eval-report runs/a",
    "trace": "trace --model tiny --question 'What is 2+3?' --out out",
    "ablate": "ablate --model tiny --heads L0H1 --question 'What is 2+3?' --out out",
    "sweep": "sweep --model tiny --out out",
    "attribute": "attribute --model tiny --out out",
    "find-heads": "find-heads --model tiny --out out",
    "patch-heads": "patch-heads --model tiny --out out",
    "mechanism": "mechanism --model tiny --question 'What is 2+3?' --out out",
    "demo": "demo --model tiny --quick --out out",
}

BAD = "\udcff"  # what the byte 0xff of a command line becomes in Python

# (command, extra arguments with {} for the bad value, bad values, a fragment of the line printed)
TABLE = [
    ("eval", "--max-new-tokens {}", ["0", "-5", "1000000000000", "x"], "--max-new-tokens"),
    ("eval", "--batch-size {}", ["0", "-1"], "--batch-size"),
    ("eval", "--n-samples {}", ["0"], "--n-samples"),
    ("eval", "--n-samples {}", ["2"], "--n-samples=2 with greedy decoding"),
    ("eval", "--conditions {}", ["bogus", "''", "w/o,w/o", "ARM+bogus"], "condition"),
    ("eval", "--sample --temperature {}", ["0", "-1", "nan", "inf", "1e-40"], "--temperature"),
    ("eval", "--sample --top-p {}", ["0", "1.5", "nan"], "--top-p"),
    ("eval", "--limit {}", ["0"], "--limit"),
    ("eval", "--grade-timeout {}", ["0", "-1", "1.5", "x", "100000"], "--grade-timeout"),
    ("eval", "--arm-c {} --arm-percentile 90", ["-1"], "c must be a non-negative number"),
    ("eval", "--arm-c {} --arm-percentile 90", ["nan"], "--arm-c: expected a finite number or None, got nan"),
    ("eval", "--arm-c 0.1 --arm-percentile {}", ["900", "-1"], "percentile must be in [0, 100]"),
    ("eval", "--ablate-heads {}", ["L٣H1", "L0Hx"], "is not a head label"),
    ("eval", "--ablate-heads {}", ["''", "','"], "--ablate-heads: expected at least one head"),
    ("eval", "--out {}", ["''"], "--out: expected a folder path"),
    ("eval", "--data {}", ["runs"], "problem file runs is a folder"),
    ("eval", "--data {}", ["/dev/null"], "problem file /dev/null is not a regular file"),
    ("eval", "--device {}", ["bogus", "cuda", "cuda:3"], "device"),
    ("attention", "--question {}", ["''", "'   '"], "--question: expected text"),
    ("attention", "--question {}", ["\u200b\u200b", "\ufeff"], "--question: expected text, got only invisible"),
    ("attention", "--question {}", [f"'What {BAD} is 2+3?'"], "--question holds bytes that are not UTF-8"),
    ("attention", "--system {}", [f"'You {BAD}'"], "--system holds bytes that are not UTF-8"),
    ("attention", "--out {}", [f"'out{BAD}'"], "--out holds bytes that are not UTF-8"),
    ("attention", "--heads {}", ["1,1", "=-1", "٣"], "--heads"),
    ("attention", "--layers {}", ["0,0", "-1"], "--layers"),
    ("attention", "--filler-count {}", ["0", "100000000000"], "--filler-count"),
    ("attention", "--no-system --system {}", ["SYS"], "--no-system and --system were both given"),
    ("attention", "--device {}", ["bogus"], "device 'bogus' is not a torch device"),
    ("trace", "--smooth {}", ["0"], "--smooth"),
    ("trace", "--schedule {}", ["entropy:nan", "entropy:-1", "bogus:3"], "schedule"),
    ("trace", "--sample --temperature {}", ["inf", "1e-40"], "--temperature"),
    ("trace", "--top-p {}", ["1.5"], "--top-p"),
    ("trace", "--n-samples {}", ["0"], "--n-samples"),
    ("trace", "--max-new-tokens {}", ["0"], "--max-new-tokens"),
    ("trace", "--think {}", ["bogus"], "bogus"),
    ("ablate", "--show-tokens {}", ["0", "1000000"], "--show-tokens"),
    ("ablate", "--heads {}", ["L٣H1", "L0Hx"], "is not a head label"),
    ("ablate", "--heads {}", ["''", "' , '"], "--heads: expected at least one head"),
    ("sweep", "--metric {}", ["bogus", "logprob"], "metric"),
    ("sweep", "--heads-per-forward {}", ["0"], "--heads-per-forward"),
    ("sweep", "--heads {}", ["H٣"], "is not a head label"),
    ("sweep", "--heads {}", ["''"], "--heads: expected at least one head"),
    ("sweep", "--tokens {}", ["7,8"], "metric entropy reads no tokens, only logit_diff does: drop --tokens"),
    ("sweep", "--answer {}", ["7"], "metric 'entropy' reads no answer"),
    ("attribute", "--tokens {}", ["7,8"], "metric entropy reads no tokens, only logit_diff does: drop --tokens"),
    ("attribute", "--answer {}", ["7"], "--metric entropy reads no answer, but --answer was given"),
    ("attribute", "--metric {}", ["attention:system"], "argument --metric: expected one of entropy, logprob, logit_diff"),
    ("find-heads", "--metric {}", ["attention:system"], "attention metrics carry no gradient"),
    ("attribute", "--random-heads 3 --verify {}", ["0"], "--random-heads 3 draws heads to verify beside the top ones, but --verify "
                                                   "is 0"),
    ("patch-heads", "--compare {}", ["w/o", "none"], "--compare w/o has no filler"),
    ("patch-heads", "--metric logprob --question x {}", ["", "--question y"], "--metric logprob needs --answer TEXT"),
    ("patch-heads", "--answer {}", ["7"], "--metric entropy reads no answer, but --answer was given"),
    ("patch-heads", "--metric logprob --question x --question y --answer 1 --answer 2 --answer {}", ["3"],
     "--answer was given 3 times for 2 questions"),
    ("patch-heads", "--question x --math500 {}", ["2"], "pass --question or --math500, not both"),
    ("patch-heads", "--patch-segments {}", ["','"], "--patch-segments: expected segment names"),
    ("patch-heads", "--heads-per-forward {}", ["0"], "--heads-per-forward"),
    ("mechanism", "--bins {}", ["0"], "--bins"),
    ("mechanism", "--eps {}", ["-1", "0", "nan"], "--eps"),
    ("mechanism", "--arm-c {}", ["inf"], "--arm-c"),
    ("mechanism", "--layer {}", ["-1"], "--layer"),
    ("eval-report", "--out {}", ["''"], "--out: expected a folder path"),
    ("demo", "--device {}", ["cuda"], "no CUDA GPU"),
]

CASES = [(cmd, extra.format(value), fragment) for cmd, extra, values, fragment in TABLE for value in values]


@pytest.fixture
def no_model_loads(monkeypatch, tmp_path):
    """Fail any attempt of the CLI to load a model (``load_cli_model`` calls these two)."""
    loaded = []

    def refuse(*args, **kwargs):
        loaded.append(args)
        raise AssertionError("the CLI loaded a model")

    monkeypatch.setattr(common, "load_model", refuse)
    monkeypatch.setattr(common, "tiny_model", refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "config.json").write_text('{"config_hash": "h", "run": {}, "conditions": {}}')
    return loaded


@pytest.mark.parametrize("command,extra,fragment", CASES, ids=[f"{c} {e}" for c, e, _ in CASES])
def test_a_bad_value_is_one_line_exit_2_before_the_model_loads(command, extra, fragment, no_model_loads, capsys):
    argv = shlex.split(f"{BASE[command]} {extra}".replace(" =", "="))
    if "--data" in argv:
        argv.remove("--problems"), argv.remove("arithmetic")
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("lensprobe"), err
    assert fragment in err, err
    assert no_model_loads == []


def test_the_table_has_a_row_for_every_command():
    assert {c for c, *_ in TABLE} == set(BASE)


def test_a_good_command_does_reach_the_model_load(no_model_loads, capsys):
    """The fixture sees loads: without a bad value the command gets as far as loading (and fails there)."""
    assert main(shlex.split(BASE["attention"])) == 1
    assert len(no_model_loads) == 1 and "the CLI loaded a model" in capsys.readouterr().err


def test_the_error_log_is_written_whole_in_utf8_even_with_undecodable_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("LENSPROBE_CACHE", str(tmp_path))
    path = write_error_log(f"lensprobe attention --question 'a{BAD}'", f"Traceback (most recent call last):\n  'b{BAD}'\n")
    text = path.read_bytes().decode("utf-8")  # valid UTF-8, never empty
    assert "lensprobe attention --question 'a?'" in text and "Traceback (most recent call last)" in text


def test_a_null_answer_is_named_as_null_not_as_missing(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "What is 2+3?", "answer": null}\n', encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"line 1: its 'answer' is None \(fields: \['answer', 'problem'\]\)"):
        lp.evals.load_problems(path)
