"""The report's attribution section on the tiny model: its exact column is the ablation sweep's."""

import torch

from lensprobe.app.sections import attribution
from lensprobe.app.sections.filler import demo_question
from lensprobe.experiments.sweep import ablation_sweep
from lensprobe.studies.filler import FillerSetup, condition_prompts
from lensprobe.viz.report import write_report


def test_attribution_section_on_tiny_model(tiny, tmp_path):
    section = attribution.build_demo_section(tiny, quick=True)
    assert len(section.figures) == 2
    att, ver = section.tables["attribution"], section.tables["verification"]
    assert len(att) == 8 and list(ver["chosen"]) == ["top"] * 3 + ["sample"] * 2
    prompts = condition_prompts(tiny, demo_question(True)[0], FillerSetup(conditions=("w/o", "w/ Mless")))
    sweep = ablation_sweep(tiny, [prompts["w/o"], prompts["w/ Mless"]], "entropy", progress=False)
    grid = sweep.grid()
    want = [float(grid[r.layer, r.head]) for r in ver.itertuples()]
    torch.testing.assert_close(torch.tensor(ver["exact"].values, dtype=torch.float32), torch.tensor(want),
                               rtol=1e-4, atol=1e-7)
    index = write_report(tmp_path, [section])
    assert "Head attribution (AtP*)" in index.read_text(encoding="utf-8")
