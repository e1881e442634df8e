"""A recipe's values are typed and bounded when it is read, and a benchmark's data is given once."""

import pytest

import lensprobe as lp
from lensprobe.app.commands.reproduce import data_from_args
from lensprobe.app.recipe import ReproduceConfig
from lensprobe.app.reproduce_tables import check_filler_fits
from lensprobe.core.errors import LensprobeError, SettingError

HEAD = 'title = "mine"\nkind = "table"\nbenchmarks = ["math500"]\nconditions = ["w/o", "w/ mine"]\n'


def recipe(tmp_path, text: str):
    path = tmp_path / "mine.toml"
    path.write_text(HEAD + text, encoding="utf-8")
    return lp.load_recipe(path)


@pytest.mark.parametrize(("define", "message"), [
    ("count = true", r"define.'w/ mine'.count: expected a whole number between 1 and 10,000,000, got True \(bool\)"),
    ("count = 1000000000", "define.'w/ mine'.count: expected a whole number between 1 and 10,000,000, got 1000000000"),
    ("count = 5.0", r"count: expected a whole number .*got 5.0 \(float\)"),
    ('symbol = ""', "define.'w/ mine'.symbol: expected a non-empty string"),
    ("word = 3", "define.'w/ mine'.word: expected a non-empty string, got 3"),
    ('placement = "middle"', "define.'w/ mine'.placement: expected one of"),
])
def test_a_define_value_of_the_wrong_type_or_size_is_refused_when_read(tmp_path, define, message):
    with pytest.raises(LensprobeError, match=message):
        recipe(tmp_path, f'[define."w/ mine"]\nbase = "w/ Mless"\n{define}\n')
    assert recipe(tmp_path, '[define."w/ mine"]\nbase = "w/ Mless"\ncount = 5\n').define["w/ mine"]["count"] == 5


def test_a_key_given_twice_in_a_recipe_is_refused(tmp_path):
    with pytest.raises(LensprobeError, match="mine.toml"):
        recipe(tmp_path, '[define."w/ mine"]\nbase = "w/ Mless"\ncount = 5\ncount = 6\n')


@pytest.mark.unchecked
def test_a_recipe_setting_of_the_wrong_type_is_refused(tmp_path):
    with pytest.raises(LensprobeError, match=r"settings.quick: expected true or false \(a bool\) or None, got 'yes'"):
        recipe(tmp_path, '[define."w/ mine"]\nbase = "w/ Mless"\n[settings]\nquick = "yes"\n')
    with pytest.raises(LensprobeError, match="settings.limit: expected a whole number or None, got True"):
        recipe(tmp_path, '[define."w/ mine"]\nbase = "w/ Mless"\n[settings]\nlimit = true\n')


def test_a_benchmarks_data_given_twice_is_refused(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("{}\n")
    b.write_text("{}\n")
    with pytest.raises(SettingError, match="benchmark_data names aime2024 twice: give one file per benchmark"):
        ReproduceConfig(benchmark_data=[f"aime2024={a}", f"AIME2024={b}"])
    with pytest.raises(SettingError, match=r"names aime2024 twice \(.*a.jsonl and .*b.jsonl\): give one file"):
        data_from_args([f"aime2024={a}", f"aime2024={b}"])
    assert data_from_args([f"aime2024={a}", f"aime2025={b}"]) == {"aime2024": a, "aime2025": b}


def test_a_filler_longer_than_the_context_is_refused_before_its_text_is_built(tiny):
    n_ctx = tiny.cfg.n_ctx
    check_filler_fits(tiny, {"count": n_ctx}, "here")  # one token a repetition: it may fit
    with pytest.raises(LensprobeError, match=f"here: count {n_ctx + 1:,} x 1 token.*context of {n_ctx:,} tokens"):
        check_filler_fits(tiny, {"count": n_ctx + 1}, "here")
    with pytest.raises(LensprobeError, match="here: count 1,000,000,000 x"):
        check_filler_fits(tiny, {"count": 1_000_000_000, "symbol": "?"}, "here")
