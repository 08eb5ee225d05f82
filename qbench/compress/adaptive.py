"""Entropy-adaptive bit widths with Huffman coding (Øland & Raj, seed 004, Algorithms 1-2).

Per layer, following Algorithm 1 (``scope: layer``, the default: the schemes hand the codec the
tensor boundaries and every tensor gets its own N and scale, one header each; ``scope: global``
picks one N and scale per encode call, over a whole layer group or an owner range):

1. Estimate the entropy H (bits) of the values from a sample of a fraction F of them (at least
   min(n, 64)), binned into 2^M equal bins over [min, max] of the tensor (section 3.4: "we
   compute H from a preliminary quantization of the weights to M bits"; 3% of the weights
   suffice; Algorithm 1 lines 3-4). ``entropy_grid: symmetric`` bins over [-s, s], s = max |x|,
   instead: what qbench did first; zero is then a bin edge, which splits a peak at zero in two
   and adds up to a bit to H on peaked gradients (Student-t data: N = 8 instead of 7).
2. Bit width N = H + c (section 3.4), rounded up to whole bits: N = ceil(H) + c. As H <= M for
   2^M bins, N lies in [c, c + M]: c is the floor, c + M the ceiling (section 5.1).
3. Quantize every value to N bits, then Huffman-code the levels with a codebook built from
   their histogram (Algorithm 1 lines 6-9); the codebook travels with the payload.

Departures from the paper, for gradients: the quantizer is unbiased stochastic rounding on a
symmetric grid with s = max |x| (levels j * s / L, |j| <= L = 2^(N-1) - 1, so 0 is exact)
instead of deterministic binning over [min, max] decoded at bin centres; sample positions and
rounding draws come from the counter-based rng, so an encode is reproducible per Key. When
Huffman coding plus its codebook would be larger than plain N-bit codes (small tensors), the
plain codes are sent instead.

Wire (self-describing, so ``fixed_size`` is False and ``wire_layout`` is not defined):
  "header"     int32[4]  N, coding (0 = plain N-bit codes, 1 = Huffman), k symbols, block
  "scale"      float32[1] s
  "block_bits" int16[B]  Huffman only (k >= 2): bits of each block of ``block`` values
  "symbols"    uint8[2k] Huffman only: used symbols j + L, ascending, uint16 little-endian
  "lengths"    uint8[k]  Huffman only: their code lengths (canonical code)
  "stream"     uint8[..] codes MSB first (see ``huffman``), ceil(bits / 8) bytes
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from qbench.compress import huffman
from qbench.compress.base import Compressor, Key, Payload, require_finite
from qbench.compress.kernels.draws import uniform

_BLOCK = 512  # values per Huffman block: 512 numpy steps to decode; 16 bits of length each
_MIN_SAMPLE = 64
_SAMPLE_SALT = 0x5A4D504C  # keys the sample positions apart from the rounding draws
_PLAIN, _HUFFMAN = 0, 1


class Adaptive(Compressor):
    name: ClassVar[str] = "adaptive"
    # Parameters (documented and validated in qbench.catalog.compressors):
    sample_fraction: float
    """F: fraction of the values sampled to estimate the entropy (paper: 3%)."""
    probe_bits: int
    """M: bits of the preliminary quantizer whose histogram gives the entropy (paper: 4)."""
    floor_bits: int
    """c: floor on the bit width; widths range over [c, c + M] (paper: 6, with M = 4)."""
    scope: Literal["layer", "global"]
    """layer: N and the scale per tensor (the paper); global: one per encode call."""
    entropy_grid: Literal["minmax", "symmetric"]
    """The probe's bins: over [min, max] (the paper) or [-max |x|, max |x|]."""

    def __init__(self, *, seed: int = 0, **params: Any) -> None:
        super().__init__(seed=seed, **params)
        self.last_bits_per_value = 0.0
        """Achieved wire bits per value of the last encode (payload bytes * 8 / numel)."""
        self.last_width = 0
        """Bit width N chosen by the last encode."""

    def _encode(self, grad: torch.Tensor, key: Key, offset: int, name: str) -> Payload:
        n = grad.numel()
        scale = grad.abs().max() if n else grad.new_zeros(())
        require_finite(self.name, grad, probe=scale, offset=offset)  # not numpy's NaN error
        ratio = grad / torch.where(scale > 0, scale, 1.0)
        entropy = _sample_entropy(
            ratio, self.sample_fraction, self.probe_bits, key, self.entropy_grid == "minmax"
        )
        width = _bit_width(entropy, self.floor_bits, self.probe_bits)
        u = uniform(key, offset, n, grad.device)
        coded = _code(_quantize(ratio, u, width).cpu().numpy(), width)
        k = coded["lengths"].numel() if "lengths" in coded else 0
        coding = _HUFFMAN if "lengths" in coded else _PLAIN
        buffers = {
            "header": torch.tensor([width, coding, k, _BLOCK], dtype=torch.int32),
            "scale": scale.reshape(1).to(torch.float32),
            **coded,
        }
        payload = Payload(numel=n, buffers={b: t.to(grad.device) for b, t in buffers.items()})
        self.last_width = width
        self.last_bits_per_value = payload.nbytes * 8 / n if n else 0.0
        return payload

    def _decode(self, payload: Payload) -> torch.Tensor:
        b = payload.buffers
        width, coding, _, block = (int(v) for v in b["header"].tolist())
        stream = b["stream"].cpu().numpy()
        if coding == _PLAIN:
            symbols = huffman.read_fixed(stream, width, payload.numel)
        else:
            book = huffman.Codebook(_u16(b["symbols"].cpu().numpy()), b["lengths"].cpu().numpy())
            no_blocks = torch.zeros(0, dtype=torch.int16)  # one symbol: no stream at all
            block_bits = b.get("block_bits", no_blocks).cpu().numpy().astype(np.int64)
            symbols = huffman.decode(stream, block_bits, book, payload.numel, block)
        levels = torch.from_numpy(symbols).to(b["scale"].device)
        top = (1 << (width - 1)) - 1
        return (levels - top).to(torch.float32) * (b["scale"] / top)

    def _wire_size_at(self, wire: torch.Tensor, numel: int) -> int:
        """Bytes of the payload of ``numel`` values at the start of ``wire``, from its header
        (a piece of a per-tensor payload, followed by the next)."""
        _, pos, bits = _read_header(wire, numel)
        return pos + -(-bits // 8)

    def _from_wire(self, wire: torch.Tensor, numel: int) -> Payload:
        """Split a received buffer by reading its header (see the module docstring)."""
        buffers, pos, bits = _read_header(wire, numel)
        buffers["stream"] = wire[pos:]
        if buffers["stream"].numel() != -(-bits // 8):
            raise ValueError(
                f"adaptive: wire buffer has {wire.numel()} bytes, expected {pos + -(-bits // 8)}"
            )
        return Payload(numel=numel, buffers=buffers)


def widths(payload: Payload) -> list[int]:
    """The bit width N of each piece of an adaptive payload (one for a single tensor)."""
    parts = payload.parts or (payload,)
    return [int(p.buffers["header"][0]) for p in parts]


def _read_header(wire: torch.Tensor, numel: int) -> tuple[dict[str, torch.Tensor], int, int]:
    """The buffers before the stream, the stream's byte offset and its length in bits."""
    header = _field(wire, 0, torch.int32, 4)
    width, coding, k, block = (int(v) for v in header.tolist())
    valid = coding in (_PLAIN, _HUFFMAN) and 2 <= width <= 16 and 0 <= k <= 1 << width
    if not valid or not 1 <= block < 2048:  # 2047 values * 16 bits fit an int16 length
        raise ValueError(f"adaptive: bad header {header.tolist()} (corrupt or not adaptive)")
    sizes = {"header": (torch.int32, 4), "scale": (torch.float32, 1)}
    if coding == _HUFFMAN and k >= 2:
        sizes["block_bits"] = (torch.int16, -(-numel // block))
    if coding == _HUFFMAN:
        sizes |= {"symbols": (torch.uint8, 2 * k), "lengths": (torch.uint8, k)}
    buffers: dict[str, torch.Tensor] = {}
    pos = 0
    for name, (dtype, count) in sizes.items():
        buffers[name] = _field(wire, pos, dtype, count)
        pos += count * buffers[name].element_size()
    if coding == _PLAIN:
        bits = numel * width
    else:
        bits = int(buffers["block_bits"].sum()) if "block_bits" in buffers else 0
    return buffers, pos, bits


def _sample_entropy(
    ratio: torch.Tensor, fraction: float, bits: int, key: Key, minmax: bool = True
) -> float:
    """Entropy (bits) of the 2^bits-bin histogram of a sample of ``ratio`` (in [-1, 1]): bins
    over [min, max] of the whole tensor (the paper's Quantize(W_sel, w_min, w_max, M)), or over
    [-1, 1] (``minmax`` False: a bin edge at zero)."""
    n = ratio.numel()
    if n == 0:
        return 0.0
    m = min(n, max(_MIN_SAMPLE, math.ceil(fraction * n)))
    # Positions drawn with replacement; 24-bit draws resolve 2^24 distinct positions.
    u = uniform(replace(key, seed=key.seed ^ _SAMPLE_SALT), 0, m, ratio.device).double()
    picks = (u * n).long().clamp_(max=n - 1)
    bins = 1 << bits
    sample = ratio[picks].double()
    if minmax:  # the paper: floor(2^M (w - w_min) / (w_max - w_min)), the top value in bin 2^M - 1
        low, high = float(ratio.min()), float(ratio.max())
        if not high > low:
            return 0.0  # a constant tensor: one bin
        index = ((sample - low) * (bins / (high - low))).floor().long().clamp_(0, bins - 1)
    else:
        index = ((sample + 1.0) * (bins / 2)).floor().long().clamp_(0, bins - 1)
    p = torch.bincount(index, minlength=bins).double() / m
    p = p[p > 0]
    return float(-(p * torch.log2(p)).sum())


def _bit_width(entropy: float, floor_bits: int, probe_bits: int) -> int:
    """N = ceil(H) + c, within [c, c + M] (the slack absorbs rounding in a whole-bit H)."""
    return min(max(math.ceil(entropy - 1e-9) + floor_bits, floor_bits), floor_bits + probe_bits)


def _quantize(ratio: torch.Tensor, u: torch.Tensor, width: int) -> torch.Tensor:
    """Symbols j + L (int64) of the stochastically rounded levels j of ratio * L, |j| <= L."""
    top = (1 << (width - 1)) - 1
    t = ratio * top
    low = torch.floor(t)
    level = low + (u < t - low).to(t.dtype)  # up with probability frac(t): unbiased
    return level.clamp_(-top, top).to(torch.int64) + top


def _code(symbols: np.ndarray, width: int) -> dict[str, torch.Tensor]:
    """Huffman buffers, or a plain N-bit "stream" alone when that is not larger."""
    n = symbols.size
    plain_bytes = -(-n * width // 8)
    book = huffman.build_codebook(symbols)
    k = book.symbols.size
    encoded = huffman.encode(symbols, book, _BLOCK)
    huffman_bytes = (2 * encoded.block_bits.size if k >= 2 else 0) + 3 * k + encoded.stream.size
    if plain_bytes <= huffman_bytes:
        stream, _ = huffman.write_bits(symbols, np.full(n, width, np.int64), width)
        return {"stream": torch.from_numpy(stream)}
    buffers = {
        "symbols": torch.from_numpy(_u16_bytes(book.symbols)),
        "lengths": torch.from_numpy(book.lengths),
        "stream": torch.from_numpy(encoded.stream),
    }
    if k >= 2:  # one symbol alone has a zero-length code: no blocks, no stream
        buffers = {"block_bits": torch.from_numpy(encoded.block_bits.astype(np.int16))} | buffers
    return buffers


def _u16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<u2").view(np.uint8)


def _u16(raw: np.ndarray) -> np.ndarray:
    return raw.view("<u2").astype(np.int64)


def _field(wire: torch.Tensor, pos: int, dtype: torch.dtype, count: int) -> torch.Tensor:
    """``count`` values of ``dtype`` at byte ``pos`` of ``wire`` (copied when misaligned)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if pos + count * size > wire.numel():
        raise ValueError(f"adaptive: wire buffer of {wire.numel()} bytes is truncated")
    chunk = wire[pos : pos + count * size]
    if chunk.storage_offset() % size:
        chunk = chunk.clone()
    return chunk.view(dtype)
