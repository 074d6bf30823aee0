"""Mixed precision (lesson 6): what a floating-point format can hold, and what FSDP moves.

A binary float with ``p`` significand bits (the leading 1 included) stores x = m * 2^e with
``1 <= m < 2`` written in p bits. Everything below follows from ``p`` and the exponent range,
both read from ``torch.finfo`` (eps = 2^-(p-1), tiny = the smallest normal number):

    format    p    unit roundoff 2^-p    max finite    smallest normal    exact integers up to
    fp32     24    6.0e-8                3.4e38        1.2e-38            16,777,216
    bf16      8    3.9e-3                3.4e38        1.2e-38            256
    fp16     11    4.9e-4                65504         6.1e-5             2048

bf16 keeps fp32's range with a 3-digit significand; fp16 has 3 more bits of precision but a
range that gradients leave (underflow below the smallest subnormal, overflow above 65504),
hence its loss scaler.
"""

from __future__ import annotations

import math

import torch

from fsdp_course.theory.fsdp2 import padded_numel
from fsdp_course.theory.sharding import padded


def significand_bits(dtype: torch.dtype) -> int:
    """``p``: the significand's bits, its leading 1 included. eps = 2^-(p-1) is the gap after 1.0,
    so p = 1 - log2(eps): 24 for fp32, 8 for bf16, 11 for fp16."""
    return 1 - round(math.log2(torch.finfo(dtype).eps))


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of rounding one real number to ``dtype``: half the gap after
    1.0, u = eps / 2 = 2^-p (bf16: 0.0039, fp16: 0.00049, fp32: 6e-8)."""
    return 2.0 ** -significand_bits(dtype)


def exact_integer_limit(dtype: torch.dtype) -> int:
    """2^p: every integer up to it is exact; above it the gap is 2 or more, so integers round
    (bf16: 256, fp16: 2048). A position stored or multiplied in bf16 past 256 is rounded."""
    return 2 ** significand_bits(dtype)


def spacing(x: float, dtype: torch.dtype) -> float:
    """The gap between neighbouring ``dtype`` numbers around ``x`` (normal range):
    2^(floor(log2 |x|) - (p - 1)). Rounding moves a value by at most half of it."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - (significand_bits(dtype) - 1))


def max_rounding_error(x: float, dtype: torch.dtype) -> float:
    """At most spacing(x) / 2: e.g. an angle of 4000 rad computed in bf16 can be off by 8 rad."""
    return spacing(x, dtype) / 2


def smallest_subnormal(dtype: torch.dtype) -> float:
    """Below this a value becomes 0 (underflow): tiny * 2^-(p-1) (fp16: 2^-24 = 6e-8)."""
    return torch.finfo(dtype).tiny * 2.0 ** -(significand_bits(dtype) - 1)


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def collective_bytes(
    shapes: list[list[int]],
    world_size: int,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    api: str = "fsdp2",
) -> dict:
    """Payload bytes of one step of a model sharded as ONE unit (the root, which stays gathered
    from forward to backward, so it is all-gathered once):

        all_gather     = padded elements * bytes(param_dtype)    (parameters travel in it)
        reduce_scatter = padded elements * bytes(reduce_dtype)   (gradients travel in it)

    Padded elements: FSDP2 pads each parameter's dim 0 to N * ceil(d0 / N) (``padded_numel``);
    classic FSDP pads its one flat parameter to N * ceil(n / N) (``padded``).
    """
    if api == "fsdp2":
        elements = sum(padded_numel(shape, world_size) for shape in shapes)
    else:
        elements = padded(sum(math.prod(shape) for shape in shapes), world_size)
    return {
        "all_gather": elements * dtype_bytes(param_dtype),
        "reduce_scatter": elements * dtype_bytes(reduce_dtype),
    }


def gathered_bytes(shapes: list[list[int]], param_dtype: torch.dtype) -> int:
    """Bytes of the unsharded parameters the forward computes with: numel * bytes(param_dtype)
    (no padding: the padding is sliced off after the all-gather)."""
    return sum(math.prod(shape) for shape in shapes) * dtype_bytes(param_dtype)
