"""IDX files, the format of MNIST and Fashion-MNIST: a strict reader and a writer.

The format is a 4-byte big-endian magic number ``0x0000TTNN`` (``TT`` the element type, ``NN``
the number of dimensions), ``NN`` big-endian uint32 sizes, then the elements, big-endian, in C
order. Files may be gzip-compressed (``.gz``), as the Debian package and the original site ship
them. We parse it ourselves (numpy only) so that reading needs neither a download helper nor
torchvision's MNIST class, and every way a file can be bad (wrong magic, truncated, trailing
bytes, broken gzip) is a ``ValueError`` naming the file instead of a garbage tensor.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

IMAGES_MAGIC = 0x00000803  # uint8, 3 dimensions: (N, rows, cols)
LABELS_MAGIC = 0x00000801  # uint8, 1 dimension: (N,)

_CODES: dict[str, int] = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}
_TYPES: dict[int, str] = {code: f">{kind}" for kind, code in _CODES.items()}  # big-endian


def read_idx(path: str | Path, *, magic: int | None = None) -> np.ndarray:
    """The array stored in an IDX file (plain or ``.gz``), in native byte order.

    ``magic``, when given, must match exactly (``IMAGES_MAGIC``, ``LABELS_MAGIC``), so that an
    images file passed as labels fails here rather than as a shape error much later.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"IDX file {path}: {len(raw)} bytes, too short for the 4-byte magic")
    got = int.from_bytes(raw[:4], "big")
    if magic is not None and got != magic:
        raise ValueError(f"IDX file {path}: magic 0x{got:08x}, expected 0x{magic:08x}")
    code, ndim = (got >> 8) & 0xFF, got & 0xFF
    if got >> 16 != 0 or code not in _TYPES or ndim == 0:
        raise ValueError(f"IDX file {path}: magic 0x{got:08x} is not an IDX header")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"IDX file {path}: truncated header ({len(raw)} of {header} bytes)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_TYPES[code])
    want = math.prod(dims) * dtype.itemsize
    if len(raw) - header != want:
        what = "truncated" if len(raw) - header < want else "trailing bytes"
        raise ValueError(
            f"IDX file {path}: {what}: dims {list(dims)} need {want} data bytes, "
            f"found {len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))  # a writable native-order copy


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as IDX (gzip-compressed when ``path`` ends in ``.gz``).

    The inverse of ``read_idx``; tests and tools use it to make small IDX files.
    """
    path = Path(path)
    kind = f"{array.dtype.kind}{array.dtype.itemsize}"
    if kind not in _CODES or array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"cannot write dtype {array.dtype} with {array.ndim} dims as IDX")
    header = struct.pack(f">I{array.ndim}I", (_CODES[kind] << 8) | array.ndim, *array.shape)
    body = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder(">")).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + body)


def _read_bytes(path: Path) -> bytes:
    """The file's (decompressed) bytes; a damaged gzip stream is a ``ValueError`` too."""
    raw = path.read_bytes()  # a missing file stays a FileNotFoundError
    if path.suffix != ".gz":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise ValueError(f"IDX file {path}: damaged gzip data ({e})") from e
