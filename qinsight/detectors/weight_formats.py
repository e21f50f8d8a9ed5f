"""What torchao's ``quantize_`` formats lose on each Linear, before anything is quantized.

Two statistics per Linear, both from the calibration (nothing quantized, no torchao needed):

- **The weight in each format.** Its SQNR quantized as ``quantize_`` quantizes it (one absmax scale per
  row for ``int8`` and ``float8``, per group of N inputs for ``int4_gN``), read once from the weight
  (:mod:`qinsight.observe.format_errors`). A Linear is judged against the model's own median Linear in the
  same format: one whose SQNR lies ``margin_db`` or more under the median (3 dB: twice the error
  power of the typical layer) is where that format loses most, and where a mixed-format plan
  (:func:`qinsight.plan_formats`) should be expected to spend its bits. No absolute threshold: a
  format's SQNR depends on the model's weights, and the model is its own reference.
- **The input under per-token int8** (``int8_dynamic``, ``int4_dynamic_gN``): one scale per token
  spans its widest value, so a channel whose typical magnitude dwarfs the others' (LLMs' massive
  activations) leaves the median channel ``8 - log2(widest / median)`` bits of the mean magnitudes:
  below ``min_bits`` the dynamic formats starve this input; weight-only formats keep it float.

The findings suggest no torch config change (the FX/PT2E fields say nothing of torchao formats): they
explain, by role, where a format plan's bits go. Opt-in (``detectors=[..., "qinsight.formats"]``);
``qinsight plan --flow torchao`` runs it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.formats import WeightFormat
from qinsight.core.precision import bits_kept
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import FormatError, ObservedStats
from qinsight.detectors._validators import positive
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.core.report import DetectorResult
    from qinsight.plugin.detector import ModelView

TOKEN_BITS = 8  # torchao's dynamic formats quantize each token's input to int8
DB_PER_BIT = 20 * math.log10(2)  # a bit fewer: the error's amplitude doubles


def _formats(value: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(WeightFormat.parse(name).name for name in value)  # one InvalidParameterError per bad name
    return tuple(sorted(set(names) - {"float"}))


@attrs.frozen(kw_only=True)
class FormatFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = (
        "no statistics",
        "weight loses most",
        "input starves per-token int8",
        "typical",
    )

    errors: tuple[FormatError, ...]  # this Linear's weight in each format that fits it
    medians: tuple[FormatError, ...]  # the model's median Linear in each format
    margin_db: float
    token_bits: float | None = None  # what per-token int8 leaves the input's median channel (None: no data)
    widest_channel: int | None = None
    widest_ratio: float | None = None  # the widest channel's mean |x| over the median channel's
    min_bits: float = 4.0

    def losses(self) -> dict[str, float]:
        """Per format, how many dB this weight lies under the model's median Linear."""
        medians = {m.format: m.sqnr for m in self.medians}
        return {
            e.format: medians[e.format] - e.sqnr
            for e in self.errors
            if e.format in medians and math.isfinite(medians[e.format] - e.sqnr)
        }

    def worst_format(self) -> tuple[str, float] | None:
        return max(self.losses().items(), key=lambda item: item[1], default=None)

    @property
    def verdict(self) -> str:
        worst = self.worst_format()
        if worst is None and self.token_bits is None:
            return "no statistics"
        if worst is not None and worst[1] >= self.margin_db:
            return "weight loses most"
        if self.token_bits is not None and self.token_bits < self.min_bits:
            return "input starves per-token int8"
        return "typical"

    @property
    def actionable(self) -> bool:
        return self.verdict in ("weight loses most", "input starves per-token int8")

    def severity(self) -> float | None:
        """dB under the typical Linear: the weight's worst format's, or the input's lost bits at 6 dB each."""
        worst = self.worst_format()
        starved = DB_PER_BIT * (self.min_bits - self.token_bits) if self.token_bits is not None else None
        found = [value for value in (worst[1] if worst else None, starved) if value is not None]
        return max(found) if found else None

    def reason(self) -> str:
        parts = []
        medians = {m.format: m.sqnr for m in self.medians}
        worst = self.worst_format()
        if worst is not None:
            name, loss = worst
            own = next(e.sqnr for e in self.errors if e.format == name)
            side = "under" if loss >= 0 else "above"
            parts.append(
                f"{name} keeps {own:.1f} dB of the weight, {abs(loss):.1f} dB {side} the median Linear's "
                f"{medians[name]:.1f}"
            )
            others = [f"{e.format} {e.sqnr:.1f}" for e in self.errors if e.format != name]
            if others:
                parts[-1] += f" ({', '.join(others)} dB)"
        if self.token_bits is not None:
            parts.append(
                f"per-token int8 leaves its input's median channel {self.token_bits:.1f} of {TOKEN_BITS} bits "
                f"(channel {self.widest_channel}: {self.widest_ratio:.3g}x its mean magnitude)"
            )
        return "; ".join(parts) if parts else "no weight or input statistics reached it"


@attrs.frozen(kw_only=True)
class FormatDetector:
    """Judges each Linear's weight in torchao's formats against the model's median Linear, and its input
    under per-token int8."""

    id: ClassVar[str] = "qinsight.formats"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = FormatFinding

    formats: tuple[str, ...] = attrs.field(default=("int8", "float8", "int4_g32", "int4_g128"), converter=_formats)
    margin_db: float = attrs.field(default=3.0, validator=positive(minimum=0.0))
    min_bits: float = attrs.field(default=4.0, validator=positive(minimum=0.0))

    def _points(self, site: OpSite) -> tuple[InsertPoint, InsertPoint]:
        return (
            InsertPoint.at(site, Side.WEIGHT, channel_axis=0, formats=self.formats),
            InsertPoint.at(site, Side.PRE, per_channel=True, tails=True),
        )

    @staticmethod
    def _linears(view: ModelView) -> tuple[OpSite, ...]:
        return tuple(site for site in view.sites if site.kind is OpKind.LINEAR)

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(point for site in self._linears(view) for point in self._points(site))

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        errors: dict[str, tuple[FormatError, ...]] = {}
        for site in self._linears(view):
            weight = stats.for_point(self._points(site)[0])
            errors[site.fqn] = weight.formats if weight is not None else ()
        medians = _medians(errors.values())
        findings = [self._finding(site, errors[site.fqn], medians, stats) for site in self._linears(view)]
        return result_of(self, findings, [])

    def _finding(
        self, site: OpSite, errors: tuple[FormatError, ...], medians: tuple[FormatError, ...], stats: ObservedStats
    ) -> FormatFinding:
        found = FormatFinding(
            fqn=site.fqn, errors=errors, medians=medians, margin_db=self.margin_db, min_bits=self.min_bits
        )
        observed = stats.for_point(self._points(site)[1])
        magnitudes = observed.tails.mean_abs() if observed is not None and observed.tails is not None else ()
        median = statistics.median(magnitudes) if magnitudes else 0.0
        if not magnitudes or median <= 0.0:
            return found
        widest = max(range(len(magnitudes)), key=magnitudes.__getitem__)
        ratio = magnitudes[widest] / median
        bits = bits_kept(TOKEN_BITS, magnitudes[widest], median)
        return attrs.evolve(found, token_bits=bits, widest_channel=widest, widest_ratio=ratio)


def _medians(per_layer: Iterable[tuple[FormatError, ...]]) -> tuple[FormatError, ...]:
    """Per format, the median of the Linears' finite SQNRs."""
    by_format: dict[str, list[float]] = {}
    for errors in per_layer:
        for error in errors:
            if math.isfinite(error.sqnr):
                by_format.setdefault(error.format, []).append(error.sqnr)
    return tuple(FormatError(format=name, sqnr=statistics.median(values)) for name, values in sorted(by_format.items()))


__all__ = ["FormatDetector", "FormatFinding"]
