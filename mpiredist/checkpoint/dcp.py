"""PyTorch DCP checkpoints, read by range (no torch needed).

A directory written by ``torch.distributed.checkpoint.save`` with the
default ``FileSystemWriter`` holds ``.metadata`` (a pickle of DCP's
``Metadata``: per name, a tensor's dtype, size and chunks -- offsets and
sizes --, and per chunk the ``.distcp`` file, offset and length of its
bytes) and the ``.distcp`` files.  Each chunk is the output of
``torch.save``: a zip archive whose ``data.pkl`` rebuilds the tensor from a
storage (dtype, storage offset, size, strides) kept uncompressed in the
entry ``data/<key>``.  :func:`read_metadata` turns that into an
:class:`~mpiredist.checkpoint.index.Index` whose pieces point at the
storages' bytes, so the reader fetches only the rows each target needs.

Both pickles are read by a restricted unpickler that knows DCP's and
torch.save's classes by name and refuses anything else: reading a
checkpoint never runs code from it, and needs no torch.  A chunk whose
storage is not in C order is read whole (within W, else an error); a
compressed one, or one written through a DCP extension (a transform), is
an error naming it.  Non-tensor items (``BytesStorageMetadata``: pickled
Python objects) are loaded with ``torch.load(weights_only=True)`` when a
load asks for them.
"""

import collections
import io
import os
import pathlib
import pickle
import struct
import sys
import zlib

import numpy as np

from ..core.backend import as_dtype
from ..core.errors import CheckpointError
from .index import Array, Index, Piece

__all__ = ["METADATA", "is_dcp", "read_metadata", "read_object", "locate"]

METADATA = ".metadata"

_TORCH_DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "bfloat16",
                 "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1",
                 "bool": "?", "complex64": "<c8", "complex128": "<c16", "uint16": "<u2",
                 "uint32": "<u4", "uint64": "<u8"}
_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
             "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
             "ComplexDoubleStorage": "complex128"}


class _Record:
    """A stand-in for one of DCP's dataclasses: keeps what unpickling gives it."""

    def __init__(self, *args, **kwargs):
        self.args, self.__dict__["kw"] = args, kwargs

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = dict(state[1], **(state[0] or {}))      # (dict, slots)
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state

    def __reduce__(self):                                     # never pickled back
        raise TypeError("not picklable")


class _Dtype(str):
    """A torch dtype read from a pickle: its name."""


def _size(*args):
    return tuple(args[0]) if args else ()


class _Unpickler(pickle.Unpickler):
    """Knows DCP's and torch.save's globals by name; anything else is refused."""

    def __init__(self, file, where):
        super().__init__(file)
        self.where = where

    def find_class(self, module, name):
        if module == "torch" and name in _TORCH_DTYPES:
            return _Dtype(name)
        if module == "torch" and name == "Size":
            return _size
        if module == "torch" and name in _STORAGES:
            return _Dtype(_STORAGES[name])
        if module == "torch.serialization" and name == "_get_layout":
            return str
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, *args: data
        if module in ("torch.distributed.checkpoint.metadata",
                      "torch.distributed.checkpoint.filesystem"):
            return type(name, (_Record,), {})
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "pathlib" and name in ("PosixPath", "WindowsPath", "PurePosixPath"):
            return pathlib.PurePosixPath
        raise CheckpointError(f"DCP checkpoint {self.where!r}: unexpected object "
                              f"{module}.{name} in a pickle; mpiredist reads tensors and "
                              "DCP's metadata only")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise CheckpointError(f"DCP checkpoint {self.where!r}: unexpected storage {pid!r}")
        return {"dtype": str(pid[1]), "key": str(pid[2]), "numel": int(pid[4])}


def _tensor(storage, offset, size, stride, *args):
    return {"storage": storage, "offset": int(offset), "size": tuple(size),
            "stride": tuple(stride)}


def is_dcp(path):
    """True if ``path`` holds a DCP ``.metadata`` file."""
    return os.path.isfile(os.path.join(path, METADATA))


def _fail(where, text):
    raise CheckpointError(f"DCP checkpoint {where!r}: {text}")


def read_metadata(path):
    """The :class:`~mpiredist.checkpoint.index.Index` of a DCP checkpoint directory.

    Pieces are made lazily: each chunk's storage is located (its zip read)
    by :func:`locate` when a load needs it.
    """
    file = os.path.join(path, METADATA)
    try:
        with open(file, "rb") as f:
            md = _Unpickler(f, path).load()
    except CheckpointError:
        raise
    except Exception as exc:        # a truncated or foreign pickle
        _fail(path, f"cannot read {file!r}: {type(exc).__name__}: {exc}")
    try:
        items = md.state_dict_metadata
        storage = {(_fqn(k), _offsets(k)): _Where(v) for k, v in md.storage_data.items()}
    except AttributeError as exc:
        _fail(path, f"{file!r} is not DCP metadata: {exc}")
    arrays, values = {}, {}
    for name, meta in items.items():
        if type(meta).__name__ == "BytesStorageMetadata":
            info = storage.get((name, None))
            values[name] = ("dcp-bytes", info)
            continue
        props = meta.properties
        dname = getattr(props, "state", (None,))[0] if hasattr(props, "state") else \
            getattr(props, "dtype", None)
        if str(dname) not in _TORCH_DTYPES:
            _fail(path, f"tensor {name!r} has dtype {dname!r}, which mpiredist does not read")
        dtype = as_dtype(_TORCH_DTYPES[str(dname)])
        shape = tuple(meta.size)
        array = arrays[name] = Array((name,), shape, dtype, (1,) * max(1, len(shape)), [])
        for chunk in meta.chunks:
            offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
            info = storage.get((name, offsets))
            if info is None:
                _fail(path, f"tensor {name!r}: no storage for its chunk at {offsets}")
            box = tuple((o, o + s) for o, s in zip(offsets, sizes))
            array.pieces.append(_LazyPiece(array, path, name, box, info))
    return Index(path, "dcp", arrays, values)


class _Where:
    """Where DCP stored one item: file, offset, length, extensions (kept small:
    a load keeps one per chunk, not DCP's records)."""

    __slots__ = ("relative_path", "offset", "length", "transform_descriptors")

    def __init__(self, info):
        self.relative_path, self.offset = str(info.relative_path), int(info.offset)
        self.length = int(info.length)
        found = getattr(info, "transform_descriptors", None)
        self.transform_descriptors = tuple(found) if found else None


def _fqn(key):
    return key.fqn


def _offsets(key):
    off = getattr(key, "offset", None)
    return None if off is None else tuple(off)


class _LazyPiece(Piece):
    """A DCP chunk; its storage's place in the file is found on first use."""

    __slots__ = ("where", "name", "info", "located")

    def __init__(self, array, where, name, box, info):
        super().__init__(array, box, os.path.join(where, info.relative_path), None)
        self.where, self.name, self.info, self.located = where, name, info, False

    def locate(self):
        if not self.located:
            locate(self)
            self.located = True
        return self


def _read(fd, offset, n, file):
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CheckpointError(f"file {file!r} is truncated: {n} bytes wanted at offset "
                              f"{offset}, found {len(data)}")
    return data


def _entries(fd, start, length, file, where):
    """The zip entries of a torch.save blob at ``start``: name -> (method, size,
    local header offset), all relative to ``start``."""
    tail_n = min(length, 4096)
    tail = _read(fd, start + length - tail_n, tail_n, file)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0:
        _fail(where, f"{file!r} at {start}: not a torch.save archive (no zip directory)")
    count, cd_size, cd_off = struct.unpack_from("<HII", tail, at + 10)
    if cd_off == 0xFFFFFFFF or count == 0xFFFF:        # zip64
        loc = tail.rfind(b"PK\x06\x07", 0, at)
        rec = struct.unpack_from("<Q", tail, loc + 8)[0]
        z64 = _read(fd, start + rec, 56, file)
        count, cd_size, cd_off = struct.unpack_from("<QQQ", z64, 32)
    cd = _read(fd, start + cd_off, cd_size, file)
    out, p = {}, 0
    for _ in range(count):
        (method, csize, usize, nlen, elen, clen) = struct.unpack_from("<10xH8xIIHHH", cd, p)
        lho = struct.unpack_from("<I", cd, p + 42)[0]
        name = cd[p + 46:p + 46 + nlen].decode("utf-8", "replace")
        extra = cd[p + 46 + nlen:p + 46 + nlen + elen]
        if 0xFFFFFFFF in (csize, usize, lho):
            q = 0
            while q + 4 <= len(extra):
                tag, n = struct.unpack_from("<HH", extra, q)
                if tag == 1:
                    vals = list(struct.unpack_from(f"<{n // 8}Q", extra, q + 4))
                    if usize == 0xFFFFFFFF:
                        usize = vals.pop(0)
                    if csize == 0xFFFFFFFF:
                        csize = vals.pop(0)
                    if lho == 0xFFFFFFFF:
                        lho = vals.pop(0)
                q += 4 + n
        out[name] = (method, usize, lho)
        p += 46 + nlen + elen + clen
    return out


def _data_start(fd, start, lho, file):
    head = _read(fd, start + lho, 30, file)
    if head[:4] != b"PK\x03\x04":
        raise CheckpointError(f"file {file!r}: bad zip entry at {start + lho}")
    nlen, elen = struct.unpack_from("<HH", head, 26)
    return start + lho + 30 + nlen + elen


def locate(piece):
    """Find where the storage of a DCP chunk lies; sets the piece's offset (or
    marks it to be read whole)."""
    info, file, where = piece.info, piece.file, piece.where
    if info.transform_descriptors:
        _fail(where, f"tensor {piece.name!r}: its chunk in {file!r} was written through "
                     f"DCP extensions {list(info.transform_descriptors)}; mpiredist reads "
                     "plain torch.save chunks")
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError as exc:
        _fail(where, f"tensor {piece.name!r}: cannot open {file!r}: {exc.strerror}")
    try:
        start, length = int(info.offset), int(info.length)
        entries = _entries(fd, start, length, file, where)
        pkl = [n for n in entries if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pkl:
            _fail(where, f"tensor {piece.name!r}: {file!r} at {start} holds no data.pkl")
        method, size, lho = entries[pkl[0]]
        raw = _read(fd, _data_start(fd, start, lho, file), size if method == 0 else
                    entries[pkl[0]][1], file)
        if method == 8:
            raw = zlib.decompress(raw, -15)
        rec = _Unpickler(io.BytesIO(raw), where).load()
        if not isinstance(rec, dict) or "storage" not in rec:
            _fail(where, f"tensor {piece.name!r}: the chunk in {file!r} is not a tensor")
        prefix = pkl[0][:-len("data.pkl")]
        key = f"{prefix}data/{rec['storage']['key']}"
        if key not in entries:
            _fail(where, f"tensor {piece.name!r}: {file!r} lacks the storage {key!r}")
        method, size, lho = entries[key]
        if method != 0:
            _fail(where, f"tensor {piece.name!r}: its storage in {file!r} is compressed "
                         "(zip method {method}); mpiredist reads uncompressed storages")
        if as_dtype(_TORCH_DTYPES[rec["storage"]["dtype"]]) != piece.array.dtype:
            _fail(where, f"tensor {piece.name!r}: storage dtype {rec['storage']['dtype']} "
                         "differs from the metadata's")
        data = _data_start(fd, start, lho, file)
        if sys.byteorder != "little":
            _fail(where, "big-endian machines are not supported")
    finally:
        os.close(fd)
    shape, stride = rec["size"], rec["stride"]
    want = tuple(hi - lo for lo, hi in piece.box)
    if shape != want:
        _fail(where, f"tensor {piece.name!r}: the chunk in {file!r} has shape {shape}, the "
                     f"metadata says {want}")
    itemsize = piece.array.dtype.itemsize
    piece.offset = data + rec["offset"] * itemsize
    if stride != _c_strides(shape) and int(np.prod(shape)) > 1:
        dense = sorted(zip(stride, shape))
        expect = 1
        for s, n in dense:
            if n > 1 and s != expect:
                _fail(where, f"tensor {piece.name!r}: its storage in {file!r} has strides "
                             f"{stride} that leave gaps; mpiredist reads dense storages")
            expect *= n
        piece.whole, piece.strides = True, stride
    end = piece.offset + int(np.prod(shape)) * itemsize
    if end > data + size:
        _fail(where, f"tensor {piece.name!r}: its storage in {file!r} is shorter than the "
                     "tensor")


def _c_strides(shape):
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= max(n, 1)
    return tuple(reversed(out))


def read_object(index, name, limit):
    """A non-tensor item of a DCP checkpoint (read whole, at most ``limit`` bytes)."""
    info = index.values[name][1]
    file = os.path.join(index.where, info.relative_path)
    if info.length > limit:
        _fail(index.where, f"item {name!r} in {file!r} is {info.length} bytes, more than "
                           f"the workspace of {limit} bytes")
    try:
        import torch
    except ImportError:
        _fail(index.where, f"item {name!r} is a pickled Python object; reading it needs torch")
    with open(file, "rb") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
    if len(blob) != info.length:
        _fail(index.where, f"item {name!r}: {file!r} is truncated")
    return torch.load(io.BytesIO(blob), weights_only=True)
