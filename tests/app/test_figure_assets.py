"""``plotly.min.js`` beside the figures: written atomically, and checked against plotly's own bytes before it
is reused (a copy cut short by a file-size limit or a full disk is written again, not kept)."""

import errno
import resource

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from lensprobe.app.common import write_figure

WHOLE = get_plotlyjs().encode("utf-8")


def test_a_bundle_cut_short_or_edited_is_written_again(tmp_path):
    bundle = tmp_path / "plotly.min.js"
    for wrong in (WHOLE[:307_200], WHOLE[:-1] + b";", b""):
        bundle.write_bytes(wrong)
        write_figure(go.Figure(), tmp_path / "fig.html")
        assert bundle.read_bytes() == WHOLE
    assert 'src="plotly.min.js"' in (tmp_path / "fig.html").read_text(encoding="utf-8")


def test_a_link_in_place_of_the_bundle_is_replaced_by_the_file(tmp_path):
    bundle = tmp_path / "plotly.min.js"
    bundle.symlink_to("/dev/full")
    write_figure(go.Figure(), tmp_path / "fig.html")
    assert not bundle.is_symlink() and bundle.read_bytes() == WHOLE


def test_a_file_size_limit_leaves_no_partial_bundle_and_the_next_run_writes_it_whole(tmp_path):
    """``(ulimit -f 300; lensprobe attention ...)``: the write fails (Python ignores SIGXFSZ: EFBIG), nothing
    half-written is left, and the next run writes the whole bundle."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, hard))
    try:
        with pytest.raises(OSError) as err:
            write_figure(go.Figure(), tmp_path / "fig.html")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert err.value.errno == errno.EFBIG
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    write_figure(go.Figure(), tmp_path / "fig.html")
    assert (tmp_path / "plotly.min.js").read_bytes() == WHOLE
