"""Kernel arguments marshalled as CuPy's RawKernel passes them, checked against the parameters.

CuPy hands the driver one pointer per argument, to as many bytes as the argument's own type
has: a numpy scalar its dtype's, a Python int 8 (int64), a float 8 (float64), a bool 1, an
array an 8-byte device pointer. The driver then reads as many bytes as the kernel's parameter
has, so an np.int32 passed for an int64_t parameter reads 4 bytes of garbage on a GPU, without
an error. The emulator knows each parameter's type (kernels/emulate/cuda_emu.h: type_code) and
refuses any argument whose type is not exactly it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_C_NAMES = {
    "b1": "bool",
    "f2": "half",
    "f4": "float",
    "f8": "double",
    **{f"i{n}": f"int{8 * n}_t" for n in (1, 2, 4, 8)},
    **{f"u{n}": f"uint{8 * n}_t" for n in (1, 2, 4, 8)},
    "v": "void",
}
_TORCH_CODES = {
    torch.bool: "b1",
    torch.float16: "f2",
    torch.float32: "f4",
    torch.float64: "f8",
    torch.int8: "i1",
    torch.int16: "i2",
    torch.int32: "i4",
    torch.int64: "i8",
    torch.uint8: "u1",
}


@dataclass(frozen=True)
class Marshalled:
    """One launch's arguments, ready for the emulator."""

    values: list[bytes]
    """Per argument, the bytes its parameter is read from (cuLaunchKernel's kernelParams)."""
    tensors: dict[int, torch.Tensor]
    """Argument index -> the tensor whose address that argument carries."""
    codes: list[str]
    """The kernel's parameter types (type codes, see c_type)."""


def c_type(code: str) -> str:
    """'c*f4' -> 'const float *', 'i8' -> 'int64_t'."""
    if code.startswith("c*"):
        return f"const {c_type(code[2:])} *"
    if code.startswith("*"):
        return f"{c_type(code[1:])} *"
    return _C_NAMES.get(code, f"a {code[1:]}-byte struct")


def marshal(name: str, codes: list[str], args: Sequence[object]) -> Marshalled:
    """The bytes of each argument; TypeError naming the first one the kernel would misread."""
    if len(args) != len(codes):
        raise TypeError(f"{name}: {len(args)} arguments for its {len(codes)} parameters")
    values, tensors = [], {}
    for i, (code, arg) in enumerate(zip(codes, args, strict=True)):
        if isinstance(arg, torch.Tensor):
            _check_tensor(name, i, code, arg)
            tensors[i] = arg
            values.append(struct.pack("<Q", arg.data_ptr()))
            continue
        got, data = _scalar(name, i, arg)
        if _is_pointer(code) and got in ("u8", "i8") and not any(data):
            values.append(data)  # a null pointer (cuda.py passes np.uint64(0))
            continue
        if got != code:
            what = "a raw address" if _is_pointer(code) else c_type(got)
            raise TypeError(
                f"{name}: argument {i} is {what} ({arg!r}), the parameter is {c_type(code)}"
            )
        values.append(data)
    return Marshalled(values=values, tensors=tensors, codes=list(codes))


def _is_pointer(code: str) -> bool:
    return code.startswith(("*", "c*"))


def _check_tensor(name: str, i: int, code: str, t: torch.Tensor) -> None:
    where = f"{name}: argument {i} ({c_type(code)})"
    if not _is_pointer(code):
        raise TypeError(f"{where} is a tensor; pass a numpy scalar of the parameter's type")
    pointee = code.removeprefix("c")[1:]
    if pointee not in ("v", _TORCH_CODES.get(t.dtype)):
        raise TypeError(f"{where} is a {t.dtype} tensor")
    if not t.is_contiguous():
        raise TypeError(f"{where} is a strided tensor, which the kernel would read as contiguous")
    if t.device.type != "cpu":
        raise TypeError(f"{where} is on {t.device}; the emulator runs on CPU tensors")


def _scalar(name: str, i: int, arg: object) -> tuple[str, bytes]:
    """The type code and bytes CuPy would pass for a scalar argument."""
    if isinstance(arg, np.generic):
        return f"{arg.dtype.kind}{arg.dtype.itemsize}", arg.tobytes()
    if isinstance(arg, bool):
        return "b1", np.bool_(arg).tobytes()
    if isinstance(arg, int):
        value = np.uint64(arg) if arg >= 2**63 else np.int64(arg)
        return f"{value.dtype.kind}8", value.tobytes()
    if isinstance(arg, float):
        return "f8", np.float64(arg).tobytes()
    raise TypeError(f"{name}: argument {i} is a {type(arg).__name__}, which a kernel cannot take")
