"""Property tests for plans between meshes, without MPI (hypothesis).

The piece model's rules run in its numpy simulator
(:func:`mpiredist.planning.pieces.simulate`) over random pairs of meshes on
subsets of up to 8 ranks, and every target block is compared with the
oracle's.  The refined mesh of two nesting meshes is checked to give every
rank the same block as the original meshes.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import mpiredist as mr
import oracle
from mpiredist.planning.crossmesh import cross_plan, refine, rewrite
from mpiredist.planning.pieces import layout_boxes, layout_sources, layout_targets, simulate

FACTORINGS = {1: [[1]], 2: [[2]], 3: [[3]], 4: [[4], [2, 2]], 5: [[5]], 6: [[6], [2, 3], [3, 2]],
              7: [[7]], 8: [[8], [2, 4], [4, 2], [2, 2, 2]]}


@st.composite
def meshes(draw, comm_size, prefix):
    n = draw(st.integers(1, comm_size))
    sizes = draw(st.sampled_from(FACTORINGS[n]))
    ranks = draw(st.permutations(range(comm_size)))[:n]
    axes = {f"{prefix}{i}": s for i, s in enumerate(sizes)}
    return mr.Mesh(axes, ranks=ranks if draw(st.booleans()) or n < comm_size else None)


@st.composite
def layouts(draw, mesh, ndim, partial_ok):
    dims, partial = [[] for _ in range(ndim)], []
    for name in draw(st.permutations(mesh.names)):
        where = draw(st.integers(-2 if partial_ok else -1, ndim - 1))
        if where >= 0:
            dims[where].append(name)
        elif where == -2:
            partial.append(name)
    return mr.Layout(dims, partial)


@st.composite
def cases(draw):
    comm_size = draw(st.integers(1, 8))
    m1, m2 = draw(meshes(comm_size, "x")), draw(meshes(comm_size, "a"))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    return (comm_size, m1, draw(layouts(m1, ndim, True)), m2, draw(layouts(m2, ndim, False)),
            shape, draw(st.sampled_from(["float64", "int32", "complex64"])))


def _device(mesh, rank):
    ranks = mesh.device_ranks()
    return ranks.index(rank) if rank in ranks else None


@settings(max_examples=300, deadline=None)
@given(cases())
def test_exchange_matches_oracle(case):
    comm_size, m1, src, m2, dst, shape, dtype = case
    G = (np.arange(int(np.prod(shape))).reshape(shape) % 11).astype(dtype)
    classes = int(np.prod([m1.axis_size(a) for a in src.partial]))
    # class c holds G on class 0 and zeros elsewhere: sums give G exactly
    per_class = [G if c == 0 else np.zeros_like(G) for c in range(classes)]
    blocks = simulate(per_class, layout_sources(shape, m1, src, comm_size),
                      layout_targets(shape, m2, dst, comm_size))
    dims = [list(d) for d in dst.dims]
    for rank in range(comm_size):
        device = _device(m2, rank)
        if device is None:
            assert blocks[rank] is None
        else:
            assert np.array_equal(blocks[rank], oracle.expected(G, list(m2.axes), dims, device))


@settings(max_examples=200, deadline=None)
@given(cases())
def test_cross_plan_counts_every_byte_once(case):
    comm_size, m1, src, m2, dst, shape, dtype = case
    p = cross_plan(shape, np.dtype(dtype), m1, src.without_partial(), m2, dst, comm_size)
    # every target element not already on its rank arrives once
    boxes = layout_boxes(shape, m2, dst, comm_size)
    most = sum(int(np.prod([b - a for a, b in box])) for box in boxes if box is not None)
    assert 0 <= p.bytes_total <= most * np.dtype(dtype).itemsize
    assert p.bytes_received_max <= p.bytes_total and p.parts >= (1 if p.bytes_total else 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.sampled_from(FACTORINGS[n]), st.sampled_from(FACTORINGS[n]))),
    st.integers(1, 3), st.data())
def test_refined_mesh_gives_the_same_blocks(sizes, ndim, data):
    a = mr.Mesh({f"x{i}": s for i, s in enumerate(sizes[0])})
    b = mr.Mesh({f"a{i}": s for i, s in enumerate(sizes[1])})
    found = refine(a, b)
    cuts = lambda m: {int(np.prod(m.sizes[i:])) for i in range(len(m.sizes) + 1)}  # noqa: E731
    union = sorted(cuts(a) | cuts(b))
    assert (found is not None) == all(y % x == 0 for x, y in zip(union, union[1:]))
    if found is None:
        return
    refined, runs_a, runs_b = found
    shape = tuple(data.draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    for mesh, runs in ((a, runs_a), (b, runs_b)):
        lay = data.draw(layouts(mesh, ndim, False))
        assert layout_boxes(shape, mesh, lay, mesh.size) == \
            layout_boxes(shape, refined, rewrite(lay, runs), mesh.size)


@settings(max_examples=200, deadline=None)
@given(cases())
def test_auto_ranks_never_move_more(case):
    comm_size, m1, src, _, _, shape, dtype = case
    n = comm_size
    sizes = FACTORINGS[n][-1]
    target = mr.Mesh({f"a{i}": s for i, s in enumerate(sizes)}, ranks="auto")
    dst = mr.Layout([list(target.names)] + [[] for _ in shape[1:]])
    src = src.without_partial()
    auto = mr.plan(shape, dtype, m1, src, dst, dst_mesh=target)
    plain = mr.plan(shape, dtype, m1, src, dst, dst_mesh=mr.Mesh(target.axes))
    assert _bytes(auto) <= _bytes(plain)


def _bytes(p):
    return getattr(p, "bytes_total", None) if hasattr(p, "bytes_total") else \
        p.bytes_sent_per_rank * p.mesh.size


def test_auto_ranks_follow_the_data():
    """A source on the ranks in reverse order: auto gives the same order, nothing moves
    (COSTA's relabelling, in its simplest case)."""
    src = mr.Mesh({"x": 4}, ranks=[3, 2, 1, 0])
    p = mr.plan((8, 8), "float32", src, "[{x},{}]", "[{a},{}]",
                dst_mesh=mr.Mesh({"a": 4}, ranks="auto"))
    assert p.dst_mesh.ranks == (3, 2, 1, 0) and p.bytes_total == 0
    q = mr.plan((8, 8), "float32", src, "[{x},{}]", "[{a},{}]", dst_mesh=mr.Mesh({"a": 4}))
    assert q.bytes_total == 256          # every block moves in the plain order
