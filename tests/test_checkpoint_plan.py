"""The pure parts of checkpoints: the tile grid, the geometry of a saved box, the
read plan and its over-read on the bench's scenarios (no MPI)."""

import importlib.util
import itertools
import math

import numpy as np
import pytest

from mpiredist.checkpoint import grid as grids
from mpiredist.checkpoint.grid import Geometry, grid
from mpiredist.checkpoint.index import Array, Piece
from mpiredist.checkpoint.plan import Target, segments, split
from mpiredist.core.blocks import interval

SHAPES = [(32000, 512), (512, 512), (1024, 512), (512, 1024), (512,), (7, 5), (3,), (),
          (64, 48, 10), (4, 1000000), (1000000, 2), (0, 4), (1, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_grid_is_powers_of_two_within_limits(shape):
    parts = grid(shape, 4)
    assert len(parts) == max(1, len(shape))
    assert all(k & (k - 1) == 0 for k in parts), parts
    assert all(k <= max(1, n) for k, n in zip(parts, shape or (1,))), parts
    if len(shape) >= 2:
        row = 4 * math.prod(-(-n // k) for n, k in zip(shape[1:], parts[1:]))
        assert row <= grids.TILE_MAX or all(2 * k > n for k, n in zip(parts[1:], shape[1:]))
        if math.prod(parts[1:]) > 1:
            assert row >= grids.PANEL_ROW or row > grids.TILE_MAX


def test_bench_shapes_align_with_8_and_16_way_splits():
    for shape in [(32000, 512), (512, 512), (1024, 512), (512, 1024)]:
        parts = grid(shape, 4)
        assert parts[1] >= 8 and parts[0] >= 16, (shape, parts)
        tile = 4 * -(-shape[0] // parts[0]) * -(-shape[1] // parts[1])
        assert grids.TILE <= tile <= 4 * grids.TILE, (shape, parts, tile)


def _boxes(shape, k0, k1):
    """Every box of ``shape`` cut into k0 x k1 (uneven allowed)."""
    for i, j in itertools.product(range(k0), range(k1)):
        yield (interval(shape[0], k0, i), interval(shape[1], k1, j))


@pytest.mark.parametrize("shape", [(37, 300), (100, 7), (64, 48, 10), (5, 3, 2, 9)], ids=str)
def test_geometry_tiles_partition_the_box(shape):
    parts = grid(shape, 2)
    box = tuple((n // 5, n - n // 7) for n in shape)
    g = Geometry(shape, parts, box, 2)
    rows = box[0][1] - box[0][0]
    at = 0
    seen = np.zeros([hi - lo for lo, hi in box[1:]], dtype=int)
    for p in range(g.panels):
        assert g.panel_offset(p) == at
        ranges = g.ranges(p)
        seen[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(ranges, box[1:]))] += 1
        assert g.row_bytes(p) == 2 * math.prod(b - a for a, b in ranges)
        at += rows * g.row_bytes(p)
    assert at == g.nbytes and np.all(seen == 1)
    covered = [g.slab_rows(s) for s in range(g.slab_count)]
    assert covered[0][0] == box[0][0] and covered[-1][1] == box[0][1]
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    want = [(i, r) for i, r in ((p, g.ranges(p)) for p in range(g.panels))
            if all(a < 40 and 3 < b for a, b in r)]
    assert g.panels_in([(3, 40)] * (len(shape) - 1)) == want


def _pieces(array, boxes):
    out = []
    for k, box in enumerate(boxes):
        if all(a < b for a, b in box):
            out.append(Piece(array, box, f"f{k}", 0, crc_at=0))
    return out


def _ratio(shape, src, dst):
    """Bytes the plan reads over the bytes the targets need, over every target."""
    dtype = np.dtype(np.float32)
    array = Array(("a",), shape, dtype, grid(shape, 4), [])
    pieces = _pieces(array, src)
    read = need = 0
    for box in dst:
        if not all(a < b for a, b in box):
            continue
        target = Target("a", box, np.empty([b - a for a, b in box], dtype))
        for s in segments(target, pieces):
            for part in split(s, 1 << 20):
                read += part.nbytes
                need += part.needed_bytes
    return read, need


def _rows(shape, k):
    return [((interval(shape[0], k, i)),) + tuple((0, n) for n in shape[1:]) for i in range(k)]


def _cols(shape, k):
    if len(shape) == 1:
        return _rows(shape, k)
    return [((0, shape[0]), interval(shape[1], k, i)) for i in range(k)]


SCENARIOS = {"8 S0 -> 8 S0": (lambda s: _rows(s, 8), lambda s: _rows(s, 8)),
             "2 S0 -> 8 S0": (lambda s: _rows(s, 2), lambda s: _rows(s, 8)),
             "8 S0 -> 8 S1": (lambda s: _rows(s, 8), lambda s: _cols(s, 8)),
             "8 S0 -> 3 S0": (lambda s: _rows(s, 8), lambda s: _rows(s, 3)),
             "1 full -> 8 S0": (lambda s: _rows(s, 1), lambda s: _rows(s, 8))}


def bench_shapes():
    spec = importlib.util.spec_from_file_location(
        "ckbench", __file__.replace("tests/test_checkpoint_plan.py", "benchmarks/checkpoint.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return [shape for _, shape in bench.tensors()]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_over_read_on_the_bench_scenarios_within_ten_percent(scenario):
    src, dst = SCENARIOS[scenario]
    read = need = 0
    for shape in bench_shapes():
        r, n = _ratio(shape, src(shape), dst(shape))
        read, need = read + r, need + n
    assert need == 4 * sum(math.prod(s) for s in bench_shapes())
    assert read / need <= 1.10, f"{scenario}: reads {read / need:.3f} x the target bytes"


def test_straight_reads_where_the_run_is_contiguous_in_the_target():
    shape = (64, 32)
    array = Array(("a",), shape, np.dtype("f4"), (8, 1), [])
    pieces = _pieces(array, _rows(shape, 2))
    target = Target("a", ((8, 40), (0, 32)), np.empty((32, 32), "f4"))
    segs = segments(target, pieces)
    assert [s.straight for s in segs] == [True, True]
    assert [s.at for s in segs] == [0, 24 * 32 * 4]
    cols = Target("a", ((0, 64), (0, 16)), np.empty((64, 16), "f4"))
    assert not any(s.straight for s in segments(cols, pieces))


def test_split_cuts_at_tile_boundaries_within_the_buffer():
    shape = (4096, 256)
    array = Array(("a",), shape, np.dtype("f4"), grid(shape, 4), [])
    piece, = _pieces(array, _rows(shape, 1))
    target = Target("a", ((100, 3000), (0, 100)), np.empty((2900, 100), "f4"))
    for s in segments(target, [piece]):
        parts = split(s, 64 << 10)
        assert all(p.nbytes <= 64 << 10 for p in parts)
        assert parts[0].rows[0] == s.rows[0] and parts[-1].rows[1] == s.rows[1]
        g = piece.geometry
        starts = {g.slab_rows(i)[0] for i in range(g.slab_count)}
        assert all(p.rows[0] in starts for p in parts)
