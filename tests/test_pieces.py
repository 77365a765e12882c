"""The piece model (mpiredist.planning.pieces), without MPI: who sends which box.

Random layouts on random meshes: every rank's pieces tile its target block,
every piece a rank expects is one its holder sends, a piece is direct only
where it is one run of both blocks, the planner's per-rank byte figure of
an exchange (costs, evaluated without enumerating ranks) is the model's
own, and parts tile a piece within their limit.
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import mpiredist as mr
from mpiredist.core.blocks import box_size
from mpiredist.core.subaxes import expand
from mpiredist.planning.costs import exchange_bytes
from mpiredist.core.blocks import contiguous_in
from mpiredist.planning.pieces import (DEPTH, MIN_PART, Holders, box_sources,
                                       layout_sources, layout_targets, part_limit, parts,
                                       recv_pieces, send_pieces)

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple)
FACTORINGS = {1: [[1]], 2: [[2]], 3: [[3]], 4: [[4], [2, 2]], 6: [[6], [2, 3]], 8: [[8], [2, 4],
                                                                                    [2, 2, 2]]}


@st.composite
def exchanges(draw):
    """A mesh of up to 8 devices, a shape and two layouts with the same partial axes."""
    n = draw(st.sampled_from(sorted(FACTORINGS)))
    sizes = draw(st.sampled_from(FACTORINGS[n]))
    mesh = mr.Mesh({f"x{i}": s for i, s in enumerate(sizes)})
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    partial = [a for a in mesh.names if draw(st.integers(0, 4)) == 0]

    def layout():
        dims = [[] for _ in range(ndim)]
        for a in draw(st.permutations([a for a in mesh.names if a not in partial])):
            where = draw(st.integers(-1, ndim - 1))
            if where >= 0:
                dims[where].append(a)
        return mr.Layout(dims, partial)
    return mesh, shape, layout(), layout()


def _model(case):
    """``(ranks, sources, targets, holders)`` of an exchange between two layouts."""
    mesh, shape, src, dst = case
    n = mesh.size
    sources = layout_sources(shape, mesh, src, n)
    return n, sources, layout_targets(shape, mesh, dst, n, keep_classes=True), Holders(sources)


@settings(max_examples=400, deadline=None)
@given(exchanges())
def test_pieces_tile_every_target_and_match_their_sends(case):
    n, sources, targets, holders = _model(case)
    sent = {(p, x.peer, x.box, x.cls) for p in range(n)
            for x in send_pieces(p, sources, targets, holders)}
    got = set()
    for q in range(n):
        t = targets[q]
        seen = np.zeros([hi - lo for lo, hi in t.box], dtype=np.int64)
        for x in recv_pieces(q, sources, targets, holders):
            assert (x.peer, q, x.box, x.cls) in sent, f"rank {q} expects {x}"
            assert x.cls == t.cls and x.first      # classes kept: nothing is combined
            # the holder holds the piece in the receiver's class
            s = sources[x.peer]
            assert s.cls == t.cls and all(a <= lo and hi <= b for (lo, hi), (a, b)
                                          in zip(x.box, s.box))
            assert x.direct == (contiguous_in(x.box, s.box) and contiguous_in(x.box, t.box))
            seen[tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(x.box, t.box))] += 1
            got.add((x.peer, q, x.box, x.cls))
        assert (seen == 1).all(), f"rank {q}'s target is not tiled once"
    assert got == sent, "a rank sends a piece nobody expects"


@settings(max_examples=300, deadline=None)
@given(exchanges())
def test_planner_prices_the_exchange_the_model_runs(case):
    mesh, shape, src, dst = case
    n, sources, targets, holders = _model(case)
    most_sent = max(sum(box_size(x.box) for x in send_pieces(p, sources, targets, holders)
                        if x.peer != p) for p in range(n))
    most_recv = max(sum(box_size(x.box) for x in recv_pieces(q, sources, targets, holders)
                        if x.peer != q) for q in range(n))
    figure, exact = exchange_bytes(shape, 1, expand(src, mesh), expand(dst, mesh), mesh.axes)
    assert figure == max(most_sent, most_recv) or not exact, (figure, most_sent, most_recv)


def test_receivers_of_one_block_spread_over_its_holders():
    """Four replicas of one row block, eight receivers of its columns: two each."""
    mesh = mr.Mesh({"x": 2, "y": 4})
    sources = layout_sources((8, 8), mesh, "[{x}, {}]", 8)
    targets = layout_targets((8, 8), mesh, "[{}, {x,y}]", 8)
    holders = Holders(sources)
    load = {p: len([x for x in send_pieces(p, sources, targets, holders) if x.peer != p])
            for p in range(8)}
    assert sorted(load.values()) == [1] * 8, load     # every holder serves one other rank


def test_partial_classes_combine_in_class_order_from_one_holder_each():
    """Two classes of one box (ranks 0, 1 and 2, 3 hold class 0 and 1): a reduced
    target takes one piece per class, the first one not combined."""
    box = ((0, 4),)
    sources = box_sources([(box, 0), (box, 0), (box, 1), (box, 1)])
    targets = [None, None, None, mr.planning.pieces.Target(((1, 3),), None)]
    got = recv_pieces(3, sources, targets)
    assert [(x.cls, x.first, x.direct) for x in got] == [(0, True, False), (1, False, False)]
    assert got[1].peer == 3 and got[0].peer in (0, 1)      # its own class from itself


@given(shapes, st.integers(1, 400))
def test_parts_tile_the_box_within_the_limit(shape, limit):
    seen = np.zeros(shape, dtype=np.int64)
    for starts, box in parts(shape, limit):
        assert math.prod(box) <= max(limit, 1) or math.prod(box) == 0
        seen[tuple(slice(s, s + n) for s, n in zip(starts, box))] += 1
    assert (seen == 1).all()


@given(shapes, st.integers(1, 400), st.integers(0, 3))
def test_parts_of_a_contiguous_box_are_contiguous(shape, limit, pad):
    """A box that spans its array after its first long dim keeps that in every part."""
    if not shape:
        return
    array = np.zeros((shape[0] + pad,) + shape[1:])
    for starts, box in parts(shape, limit):
        view = array[tuple(slice(s, s + n) for s, n in zip(starts, box))]
        assert view.flags.c_contiguous


def test_parts_cut_along_the_first_long_dim():
    assert parts((5, 3, 4), 10)[:3] == [((0, 0, 0), (1, 2, 4)), ((0, 2, 0), (1, 1, 4)),
                                        ((1, 0, 0), (1, 2, 4))]
    assert parts((5, 3, 4), 1000) == [((0, 0, 0), (5, 3, 4))]


@given(st.integers(1, 16), st.integers(0, 1 << 22), st.booleans(), st.booleans())
def test_part_limit_fits_depth_parts_in_a_side_share(itemsize, room, send, recv):
    limit = part_limit(itemsize, room, (send, recv))
    packing = send + recv
    share = room // max(1, packing) // itemsize
    if not packing or share * itemsize < MIN_PART:
        assert limit == math.inf
        return
    assert limit * itemsize >= MIN_PART or limit == share
    assert limit * DEPTH <= share or limit == share
