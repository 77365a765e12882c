"""The checkpoint format as a numpy user sees it, and DCP directories parsed without
torch's loader (one process; DCP saved by torch itself at one process)."""

import json
import os
import pickle

import numpy as np
import pytest

import mpiredist as mr
from mpiredist.checkpoint.reader import Stats


def _saved(tmp_path):
    """A checkpoint saved by one process (COMM_WORLD of one rank)."""
    pytest.importorskip("mpi4py")
    rng = np.random.default_rng(2)
    state = {"w": rng.standard_normal((300, 70)).astype(np.float32),
             "v": np.arange(10, dtype=np.int64), "step": 5}
    path = tmp_path / "ck"
    mr.save(path, state)
    return path, state


def test_a_box_read_with_numpy_alone_as_the_docs_say(tmp_path):
    """docs/checkpoint-format.md: pointer -> index -> panels of each piece, C order."""
    path, state = _saved(tmp_path)
    pointer = json.loads((path / "mpiredist.json").read_text())
    folder = path / pointer["generation"]
    index = json.loads((folder / "index.json").read_text())
    assert index["format"] == "mpiredist-checkpoint" and index["version"] == 1
    a = next(a for a in index["arrays"] if a["path"] == ["w"])
    shape, parts = a["shape"], a["grid"]
    out = np.empty(shape, dtype=a["dtype"])
    for p in a["pieces"]:
        (r0, r1), (c0, c1) = p["box"]
        c = -(-shape[1] // parts[1])                      # panel width (block rule)
        at = p["offset"]
        for k in range(c0 // c, -(-c1 // c)):
            lo, hi = max(c0, k * c), min(c1, (k + 1) * c)
            n = (r1 - r0) * (hi - lo)
            out[r0:r1, lo:hi] = np.fromfile(folder / p["file"], dtype=a["dtype"], count=n,
                                            offset=at).reshape(r1 - r0, hi - lo)
            at += n * out.itemsize
    assert np.array_equal(out, state["w"])
    values = {tuple(v["path"]): v["value"] for v in index["values"]}
    assert values == {("step",): 5}


def test_open_reads_boxes_and_only_their_tiles(tmp_path):
    path, state = _saved(tmp_path)
    ck = mr.checkpoint.open(path)
    assert ck.kind == "mpiredist" and ck.names == ["v", "w"] and ck.values == {"step": 5}
    assert ck.shape("w") == (300, 70) and ck.dtype("w") == np.float32
    stats = Stats()
    part = ck.read("w", [(100, 140), (0, 70)], stats=stats)
    assert np.array_equal(part, state["w"][100:140])
    assert stats.needed == part.nbytes and stats.read <= 1.25 * part.nbytes + 4096
    assert np.array_equal(ck.read("v"), state["v"])
    with pytest.raises(mr.CheckpointError, match="no array 'x'"):
        ck.read("x")
    with pytest.raises(mr.CheckpointError, match="not inside"):
        ck.read("w", [(0, 301), (0, 70)])


torch = None


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory):
    global torch
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    import warnings
    torch.manual_seed(0)
    state = {"w": torch.randn(40, 12), "bf": torch.randn(9, 4).to(torch.bfloat16),
             "t": torch.randn(6, 8).T, "scalar": torch.tensor(3.5),
             "i": torch.arange(7, dtype=torch.int64), "nested": {"x": torch.ones(3)},
             "step": 11}
    path = tmp_path_factory.mktemp("dcp") / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path))
    return path, state


def test_dcp_metadata_and_storages_by_range(dcp_dir):
    path, state = dcp_dir
    ck = mr.checkpoint.open(path)
    assert ck.kind == "dcp"
    assert ck.names == ["bf", "i", "nested.x", "scalar", "t", "w"]
    for name in ck.names:
        want = state["nested"]["x"] if name == "nested.x" else state[name]
        got = ck.read(name)
        assert got.shape == tuple(want.shape)
        assert np.array_equal(got.astype(np.float64), want.double().numpy()), name
    stats = Stats()
    rows = ck.read("w", [(10, 20), (0, 12)], stats=stats)
    assert np.array_equal(rows, state["w"].numpy()[10:20])
    assert stats.read == rows.nbytes            # exactly the rows: no checksums in DCP
    assert ck.dtype("bf") == mr.checkpoint.open(path).dtype("bf") and \
        str(ck.dtype("bf")) == "bfloat16"


def test_dcp_pickles_are_read_without_running_them(dcp_dir, tmp_path):
    path, _ = dcp_dir
    evil = tmp_path / "evil"
    evil.mkdir()

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    (evil / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(mr.CheckpointError, match="unexpected object"):
        mr.checkpoint.open(evil)
    (evil / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(mr.CheckpointError, match="cannot read"):
        mr.checkpoint.open(evil)
