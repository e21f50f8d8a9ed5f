"""A weight's error in torchao's ``quantize_`` formats, measured once from the weight itself.

torchao quantizes a Linear's weight symmetrically: one scale per row (``int8``, ``float8``) or per
group of ``N`` inputs of a row (``int4_gN``), the largest magnitude mapped to the edge of the value
range (``amax / ((qmax - qmin) / 2)`` for integers, ``amax / 448`` for float8 e4m3), values rounded to
nearest. The same arithmetic here gives the SQNR ``compare_weights`` reads from the quantized model
(differential test: ``tests/detectors/test_weight_formats.py``), without torchao and without quantizing.
A dynamic format quantizes the weight as its weight-only twin.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from qinsight.core.formats import WeightFormat
from qinsight.core.metrics import sqnr_of_sums
from qinsight.core.stats import FormatError

FLOAT8_MAX = 448.0  # float8 e4m3's largest finite value


def format_errors(weight: torch.Tensor, names: Iterable[str]) -> tuple[FormatError, ...]:
    """``weight`` (outputs x inputs) in each format of ``names`` that fits it (its groups divide the
    inputs; ``float`` is skipped), as :class:`FormatError`: one host read per format, at freeze."""
    rows = weight.detach().reshape(weight.shape[0], -1).double()
    power = rows.square().sum()
    found = []
    for name in names:
        fmt = WeightFormat.parse(name)
        if fmt.is_float or not fmt.fits(rows.shape[1]):
            continue
        error = (rows - _quantized(rows, fmt)).square().sum()
        found.append(FormatError(format=fmt.name, sqnr=sqnr_of_sums(float(power), float(error))))
    return tuple(found)


def _quantized(rows: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """``rows`` quantized in ``fmt`` and back to float."""
    groups = rows.reshape(rows.shape[0], -1, fmt.group or rows.shape[1])
    amax = groups.abs().amax(dim=-1, keepdim=True)
    if fmt.name == "float8":
        scale = torch.where(amax > 0, amax / FLOAT8_MAX, torch.ones_like(amax))
        values = (groups / scale).float().to(torch.float8_e4m3fn).double()
    else:
        low, high = -(2 ** (fmt.value_bits - 1)), 2 ** (fmt.value_bits - 1) - 1
        scale = torch.where(amax > 0, amax / ((high - low) / 2), torch.ones_like(amax))
        values = torch.clamp(torch.round(groups / scale), low, high)
    return (values * scale).reshape(rows.shape)


__all__ = ["format_errors"]
