"""The demo report's logit-lens section on the tiny model: its tables hold the logit lens of the prompts it
names (the last layer the model's own entropy), its figures draw those tables, and the numbers its text states
are recomputed from the tables by hand."""

import pytest

import lensprobe as lp
from lensprobe.app.sections import lens as lens_section
from lensprobe.studies.filler import FillerSetup, condition_prompts


@pytest.fixture(scope="module")
def section(tiny):
    return lens_section.build_demo_section(tiny, quick=True)


def test_the_section_holds_each_conditions_lens(section, tiny):
    study = section.data["study"]
    assert set(study["prompts"]) == {"w/o", "w/ Mless"} and len(section.figures) == 4
    assert set(section.tables) == {"lens_wo", "lens_w_Mless"}
    for cond, table in (("w/o", section.tables["lens_wo"]), ("w/ Mless", section.tables["lens_w_Mless"])):
        plain = lp.generate(tiny, condition_prompts(tiny, study["question"],
                                                                  FillerSetup(conditions=(cond,)))[cond],
                            max_new_tokens=4)
        assert plain.texts[0] == study["texts"][cond]
        last = table[table["layer"] == table["layer"].max()].sort_values("step")
        assert last["entropy"].tolist() == pytest.approx(plain.entropy.tolist(), abs=1e-5)
        assert (last["chosen_rank"] == 0).all()  # greedy: the model's own top token


def test_the_stated_numbers_come_from_the_tables(section):
    summary = section.data["study"]["summary"]
    for cond, name in (("w/o", "lens_wo"), ("w/ Mless", "lens_w_Mless")):
        table, s = section.tables[name], summary[cond]
        layers = sorted(set(table["layer"]))
        settled = []
        for _, rows in table.groupby("step"):
            ranks = dict(zip(rows["layer"], rows["chosen_rank"], strict=True))
            at = len(layers)
            for i in reversed(range(len(layers))):
                if ranks[layers[i]] != 0:
                    break
                at = i
            settled.append(layers[at] if at < len(layers) else layers[-1] + 1)
        settled.sort()
        assert s["settled_layer_median"] == settled[(len(settled) - 1) // 2]
        first = table[table["layer"] == layers[0]]
        assert s["first_layer_top_share"] == pytest.approx(float((first["chosen_rank"] == 0).mean()))
        assert s["entropy_first"] == pytest.approx(float(first["entropy"].mean()), abs=1e-6)
        assert s["kl_last"] == pytest.approx(0, abs=1e-5)
        assert f"<b>{cond}</b>" in section.intro


def test_the_figures_draw_the_tables(section):
    table = section.tables["lens_wo"]
    fig = section.figures[0]
    z = fig.data[0].z
    for row in table.itertuples():
        assert z[layers_index(table, row.layer)][row.step] == pytest.approx(row.entropy, abs=1e-6)


def layers_index(table, layer) -> int:
    return sorted(set(table["layer"])).index(layer)
