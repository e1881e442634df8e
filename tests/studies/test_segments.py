"""The attention one prompt segment receives per layer, checked against the attention patterns by hand,
and its figure."""

import pytest
import torch

import lensprobe as lp


def test_segment_attention_is_the_sum_over_its_positions_of_the_mean_from_later_queries(tiny):
    res = lp.studies.attention_received_by_condition(tiny, "What is 12+7?", layers=None)
    table = lp.studies.segment_attention(res, "question")
    assert list(dict.fromkeys(table["condition"])) == list(res.conditions)
    assert sorted(set(table["layer"])) == list(range(tiny.cfg.n_layers))
    prompt = res.prompts["w/ Mless"]
    start, end = prompt.segments["question"]
    patterns = lp.attention_patterns(tiny, prompt, layers=[1])[1]  # [head, query, key]
    n = patterns.shape[-1]
    by_head = [sum(patterns[h, j + 1:, j].mean().item() for j in range(start, end) if j + 1 < n)
               for h in range(patterns.shape[0])]
    row = table[(table["condition"] == "w/ Mless") & (table["layer"] == 1)].iloc[0]
    assert row["attention"] == pytest.approx(sum(by_head) / len(by_head), rel=1e-4)
    assert row["sd"] == pytest.approx(torch.tensor(by_head).std().item(), rel=1e-4)
    assert (row["positions"], row["heads"], row["segment"]) == (end - start, tiny.cfg.n_heads, "question")
    filler = lp.studies.segment_attention(res, "filler")
    assert "w/o" not in set(filler["condition"])  # no filler, no rows
    with pytest.raises(lp.LensprobeError, match="no prompt of this result has a segment 'answer'.*question"):
        lp.studies.segment_attention(res, "answer")

    fig = lp.viz.segment_attention_figure(table)
    assert [t.name for t in fig.data] == ["w/o filler", "Mless", "Mful", "random sentence"]
    mless = table[table["condition"] == "w/ Mless"]
    assert list(fig.data[1].y) == pytest.approx(list(mless["attention"]))
    assert "question" in fig.layout.title.text and fig.layout.xaxis.title.text == "layer"
