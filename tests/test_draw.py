"""Pictures of plans (mpiredist.draw, ``python -m mpiredist plan --draw``); no MPI."""

import subprocess
import sys

import numpy as np
import pytest

import mpiredist as mr
from mpiredist import cli, draw

TRANSPOSE = ("--mesh", "x=2,y=2", "--shape", "8,8", "--src", "[{x,y},{}]",
             "--dst", "[{},{x,y}]")


def _blend(rgba, alpha=0.85):
    """The colour a rank's stripe has on the white page (alpha 0.85)."""
    return np.array(rgba[:3]) * alpha + (1 - alpha)


def _count_near(image, colour, tol=0.02):
    return int((np.abs(image[..., :3] - colour).max(axis=-1) < tol).sum())


def test_rank_boxes_follow_the_chunk_rule_and_the_mesh_ranks():
    mesh = mr.Mesh({"x": 2, "y": 4})
    boxes = draw.rank_boxes((10, 3), mesh, "[{x,y}, {}]")
    assert [r for r, _ in boxes] == list(range(8))
    # ceil(10 / 8) = 2 rows each: five full blocks, then empty ones
    assert [b[0] for _, b in boxes] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10),
                                        (10, 10), (10, 10), (10, 10)]
    assert all(b[1] == (0, 3) for _, b in boxes)
    # y major on dim 1: device (x, y) = (1, 2) holds column block 2 of 4, row block 1
    swapped = dict(draw.rank_boxes((4, 8), mesh, "[{x}, {y}]"))
    assert swapped[6] == ((2, 4), (4, 6))
    sub = mr.Mesh({"a": 2}, ranks=[4, 5])
    assert [r for r, _ in draw.rank_boxes((4, 4), sub, "[{}, {a}]")] == [4, 5]


def test_drawn_dims_prefer_the_sharded_dims():
    lay = mr.Layout.parse
    assert draw.drawn_dims((lay("[{x},{},{}]"), lay("[{},{},{x}]")), 3) == (0, 2)
    assert draw.drawn_dims((lay("[{},{},{x}]"), lay("[{},{},{}]")), 3) == (0, 2)
    assert draw.drawn_dims((lay("[{},{}]"), lay("[{},{}] sum{x}")), 2) == (0, 1)
    assert draw.drawn_dims((lay("[{x}]"),), 1) == (0,)


def test_plan_draw_writes_both_layouts_in_each_ranks_colour(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image
    import matplotlib.pyplot as plt

    png = tmp_path / "transpose.png"
    done = subprocess.run([sys.executable, "-m", "mpiredist", "plan", *TRANSPOSE,
                           "--draw", str(png)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "all_to_all" in done.stdout and str(png) in done.stderr
    image = matplotlib.image.imread(str(png))
    assert image.shape[0] > 300 and image.shape[1] > 600
    tab10 = plt.get_cmap("tab10")
    left, right = image[:, : image.shape[1] // 2], image[:, image.shape[1] // 2:]
    for rank in range(4):
        colour = _blend(tab10(rank))
        assert _count_near(left, colour) > 500, f"rank {rank} missing from the source"
        assert _count_near(right, colour) > 500, f"rank {rank} missing from the target"
    assert _count_near(image, _blend(tab10(4))) == 0           # a fifth rank is not drawn


def test_figure_names_the_holders_the_steps_and_the_dims_left_out():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    p = mr.plan((16, 8, 12), "float32", mr.Mesh({"x": 4}), "[{x},{},{}]", "[{},{},{x}]")
    fig = draw.plan_figure(p)
    try:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        title = fig._suptitle.get_text()
        panel_titles = [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)
    assert "dims 1 not drawn" in title
    assert sum(t in ("r0", "r1", "r2", "r3") for t in texts) == 8   # four blocks, twice
    assert any(p.explain() == t for t in texts)                     # the steps, as explain
    assert any("source: [{x}, {}, {}]" in t for t in panel_titles)
    replicated = mr.plan((8, 8), "float32", mr.Mesh({"x": 2, "y": 2}), "[{x},{}] sum{y}",
                         "[{}, {}]")
    fig = draw.plan_figure(replicated)
    try:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        panel_titles = [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)
    assert "r0,r1" in texts and "r0..r3" in texts                  # shared cells
    assert any("partial sums over y" in t for t in panel_titles)


def test_between_meshes_each_side_on_its_own_ranks():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    p = mr.plan((64, 16), "float32", mr.Mesh({"x": 4}, ranks=[0, 1, 2, 3]), "[{x},{}]",
                "[{},{a}]", dst_mesh=mr.Mesh({"a": 2}, ranks=[4, 5]))
    fig = draw.plan_figure(p)
    try:
        source, target = ([t.get_text() for t in ax.texts] for ax in fig.axes[:2])
    finally:
        plt.close(fig)
    assert sorted(source) == ["r0", "r1", "r2", "r3"]
    assert sorted(target) == ["r4", "r5"]


def test_bad_dims_and_missing_matplotlib_are_clear(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    p = mr.plan((4, 4), "float32", mr.Mesh({"x": 2}), "[{x},{}]", "[{},{x}]")
    with pytest.raises(ValueError, match="dims"):
        draw.plan_figure(p, dims=(0, 2))
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib fails
    rc = cli.main(["plan", *TRANSPOSE, "--draw", str(tmp_path / "x.png")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "mpiredist[bench]" in err
    assert not (tmp_path / "x.png").exists()
