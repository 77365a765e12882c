"""The checkpoint format: the pointer, the index, and what they say (no MPI).

A checkpoint at ``path`` is a directory holding (docs/checkpoint-format.md)::

    path/mpiredist.json          the pointer: {"format", "version", "generation"}
    path/gen-000007/index.json   what is where
    path/gen-000007/r00003.bin   the bytes rank 3 wrote

The pointer is replaced atomically (``os.replace``) once every rank's data
and the index are on disk, so ``path`` always names a complete generation.
This module reads and writes the pointer and the index and checks them:
anything malformed is a :class:`~mpiredist.core.errors.CheckpointError`
naming the file.
"""

import json
import os

import numpy as np

from ..core.backend import as_dtype, dtype_text
from ..core.errors import CheckpointError, ShapeError
from .grid import Geometry

__all__ = ["FORMAT", "VERSION", "POINTER", "INDEX", "Piece", "Array", "Index", "generation_name",
           "read_pointer", "read_index", "index_document", "write_durably", "fsync_dir",
           "name_of"]

FORMAT = "mpiredist-checkpoint"
VERSION = 1
POINTER = "mpiredist.json"
INDEX = "index.json"


def generation_name(number):
    """The directory of generation ``number``."""
    return f"gen-{number:06d}"


def name_of(path):
    """The dotted name of a key path (``("model", "w")`` -> ``"model.w"``)."""
    return ".".join(str(k) for k in path)


class Piece:
    """One saved box of an array: where its bytes and their checksums are.

    ``crc_at`` is the file offset of the box's CRC-32 values (little-endian
    uint32, one per tile, panel-major: :class:`~mpiredist.checkpoint.grid.Geometry`),
    or None for storage without checksums (DCP); the reader loads the ones
    it needs into ``crcs`` (per panel: the first slab read and the values).  ``whole`` is set where the bytes can only be
    read in one piece (a DCP storage that is not in C order, of element
    ``strides``).  The geometry is made on first use.
    """

    __slots__ = ("array", "box", "file", "offset", "crc_at", "crcs", "whole", "strides",
                 "_geometry")

    def __init__(self, array, box, file, offset, crc_at=None):
        self.array, self.box, self.file, self.offset = array, box, file, offset
        self.crc_at, self.crcs = crc_at, None
        self.whole, self.strides = False, None
        self._geometry = None

    @property
    def geometry(self):
        if self._geometry is None:
            a = self.array
            self._geometry = Geometry(a.shape, a.grid, self.box, a.dtype.itemsize)
        return self._geometry

    @property
    def checked(self):
        """True where every tile has a checksum."""
        return self.crc_at is not None

    def __repr__(self):
        return f"Piece(box={self.box}, file={os.path.basename(self.file)!r}, offset={self.offset})"


class Array:
    """What a checkpoint holds of one array: shape, dtype and saved pieces."""

    __slots__ = ("path", "name", "shape", "dtype", "grid", "pieces", "layout")

    def __init__(self, path, shape, dtype, grid, pieces, layout=None):
        self.path, self.name = tuple(path), name_of(path)
        self.shape, self.dtype, self.grid, self.pieces = tuple(shape), dtype, tuple(grid), pieces
        self.layout = layout

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self):
        return f"Array({self.name!r}, shape={self.shape}, dtype={dtype_text(self.dtype)})"


class Index:
    """A checkpoint's contents: arrays and small values by dotted name."""

    __slots__ = ("where", "kind", "arrays", "values", "files", "generation")

    def __init__(self, where, kind, arrays, values, files=None, generation=None):
        self.where, self.kind, self.arrays, self.values = where, kind, arrays, values
        self.files, self.generation = files or {}, generation


def _fail(where, text):
    raise CheckpointError(f"checkpoint {where!r}: {text}")


def _load_json(file, where, what):
    try:
        with open(file, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        _fail(where, f"its {what} {file!r} is missing")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        _fail(where, f"cannot read its {what} {file!r}: {type(exc).__name__}: {exc}")


def _check_format(doc, file, where):
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        _fail(where, f"{file!r} is not an mpiredist checkpoint file (format "
                     f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    version = doc.get("version")
    if version != VERSION:
        _fail(where, f"{file!r} has format version {version!r}; this mpiredist reads "
                     f"version {VERSION} (a newer mpiredist wrote it?)")


def read_pointer(path):
    """The current generation's directory name, from ``path/mpiredist.json``."""
    file = os.path.join(path, POINTER)
    doc = _load_json(file, path, "pointer")
    _check_format(doc, file, path)
    gen = doc.get("generation")
    if not isinstance(gen, str) or os.sep in gen or gen.startswith("."):
        _fail(path, f"{file!r} names no valid generation ({gen!r})")
    return gen


def _int_box(box, ndim, where, name):
    if not isinstance(box, list) or len(box) != ndim or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r)
            for r in box):
        _fail(where, f"array {name!r}: malformed box {box!r}")
    return tuple((lo, hi) for lo, hi in box)


def read_index(path):
    """The :class:`Index` of the mpiredist checkpoint at ``path``."""
    gen = read_pointer(path)
    folder = os.path.join(path, gen)
    file = os.path.join(folder, INDEX)
    doc = _load_json(file, path, "index")
    _check_format(doc, file, path)
    arrays, values = {}, {}
    try:
        for a in doc["arrays"]:
            key = tuple(a["path"])
            name = name_of(key)
            if name in arrays:
                _fail(path, f"array {name!r} appears twice in {file!r}")
            try:
                dtype = as_dtype(a["dtype"])
            except (TypeError, ShapeError) as exc:
                _fail(path, f"array {name!r}: unknown dtype {a['dtype']!r} in {file!r}: {exc}")
            shape = tuple(int(n) for n in a["shape"])
            parts = tuple(int(k) for k in a["grid"])
            array = arrays[name] = Array(key, shape, dtype, parts, [], a.get("layout"))
            names = {}
            for p in a["pieces"]:
                box = _int_box(p["box"], len(shape), path, name)
                file = names.get(p["file"])
                if file is None:
                    file = names[p["file"]] = os.path.join(folder, p["file"])
                array.pieces.append(Piece(array, box, file, int(p["offset"]), int(p["crcs"])))
        for v in doc["values"]:
            values[name_of(v["path"])] = v["value"]
        files = {str(k): int(n) for k, n in doc["files"].items()}
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        _fail(path, f"malformed index {file!r}: {type(exc).__name__}: {exc}")
    return Index(path, "mpiredist", arrays, values, files, gen)


def index_document(arrays, values, files, saved_by):
    """The JSON document of an index (see docs/checkpoint-format.md)."""
    return {"format": FORMAT, "version": VERSION, "saved_by": saved_by,
            "arrays": arrays, "values": values, "files": files}


def fsync_dir(folder):
    """Make the entries of ``folder`` durable (a no-op where directories cannot be
    opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_durably(file, doc):
    """Write ``doc`` as JSON to ``file`` through a temporary file, fsync it, and
    rename it into place (atomic: a reader sees the old or the new file)."""
    tmp = f"{file}.tmp-{os.getpid()}"
    data = json.dumps(doc, separators=(",", ":")).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, file)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(file) or ".")
    return len(data)
