"""Where a model can be observed: op sites, observer specs and insert points.

These are plain values (no torch): a frontend describes a model as a tuple of
:class:`OpSite`, detectors answer with :class:`InsertPoint` values saying what
to observe where, and the instrumenter turns those into observers.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeVar, get_args

import attrs

from qinsight.core.errors import InvalidParameterError, InvalidValueError

# The flows qinsight quantizes through, and the frontends it reads models with: typed alike, each
# checked where a user passes it (a type checker sees the Literal, a program gets the error).
FlowName = Literal["fx", "pt2e", "torchao"]
Frontend = Literal["auto", "fx", "export", "eager"]
FLOWS: Final[tuple[FlowName, ...]] = get_args(FlowName)
FRONTENDS: Final[tuple[Frontend, ...]] = get_args(Frontend)
_Name = TypeVar("_Name", bound=str)


def _checked(owner: str, argument: str, value: str, choices: tuple[_Name, ...]) -> _Name:
    for choice in choices:
        if value == choice:
            return choice
    raise InvalidParameterError(owner, argument, value, " or ".join(repr(c) for c in choices))


def checked_flow(flow: str, owner: str) -> FlowName:
    """``flow`` if qinsight quantizes through it, else one :class:`InvalidParameterError` naming the choices."""
    return _checked(owner, "flow", flow, FLOWS)


def checked_frontend(frontend: str, owner: str) -> Frontend:
    """``frontend`` if qinsight reads models with it, else one :class:`InvalidParameterError`."""
    return _checked(owner, "frontend", frontend, FRONTENDS)


class OpKind(enum.Enum):
    """The kind of a quantizable operation.

    Linear and convolutions hold weights (``view.sites``); the others are the
    ops a flow quantizes around them (``view.ops``): binary ops, attention
    matmuls, softmax, norms, embeddings, activations with quantized kernels of
    their own, pooling and recurrent cells.
    """

    LINEAR = "linear"
    CONV1D = "conv1d"
    CONV2D = "conv2d"
    CONV3D = "conv3d"
    ADD = "add"
    MUL = "mul"
    CAT = "cat"
    MATMUL = "matmul"
    SOFTMAX = "softmax"
    LAYER_NORM = "layer_norm"
    GROUP_NORM = "group_norm"
    # a BatchNorm FX quantizes apart from the conv before it (one it cannot fold: after a functional
    # conv, as in a padding Conv2d subclass): that conv's raw output is quantized, per tensor
    BATCH_NORM = "batch_norm"
    EMBEDDING = "embedding"
    HARDTANH = "hardtanh"  # also ReLU6: a hardtanh from 0 to 6
    GELU = "gelu"
    SILU = "silu"
    SIGMOID = "sigmoid"
    POOL = "pool"
    RNN_CELL = "rnn_cell"

    @property
    def is_conv(self) -> bool:
        return self in (OpKind.CONV1D, OpKind.CONV2D, OpKind.CONV3D)

    @property
    def is_layer(self) -> bool:
        """Linear or convolution: an op with a weight that the per-channel and equalization detectors read."""
        return self is OpKind.LINEAR or self.is_conv

    @property
    def shares_scale(self) -> bool:
        """Operands end up on one scale: the output's (add), each other's (cat), or, with a
        scalar operand (``x * -1e4``), input and output share one (FX's rule for mul too)."""
        return self in (OpKind.ADD, OpKind.CAT, OpKind.MUL)

    @property
    def channel_axis(self) -> int:
        """The activation axis that holds channels (features) for this kind.

        Linear layers act on the last dimension, so ``-1`` makes
        (batch, sequence, features) inputs work; torch's ModelReport uses
        axis 1 for everything, which is the sequence axis there. Ops without a
        weight take theirs from the tensor they were seen with (:attr:`OpSite.axis`).
        """
        return 1 if self.is_conv else -1


class Side(enum.Enum):
    """Which activation of an op site is observed."""

    PRE = "pre"  # the op's input (its first tensor operand)
    OTHER = "other"  # its second tensor operand (add, mul, cat, matmul)
    POST = "post"  # the op's output
    # The op's weight, one row per input channel it reads (its own group's outputs
    # only), channel axis 0. Read once when statistics are frozen, not per batch:
    # a report file then carries what weight-reading detectors need, so reports
    # merge without the model, and shards of different weights are caught.
    WEIGHT = "weight"


class WeightScheme(enum.Enum):
    """How a weight tensor is quantized."""

    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"


@attrs.frozen(kw_only=True)
class OpCall:
    """A functional call a flow quantizes (``x + y``, ``torch.matmul``): which module's forward makes it
    (``owner``, ``""`` for the root), the call as FX records it (``target``: ``operator.add``,
    ``torch.matmul``, or a method name such as ``softmax``), and its index among the calls of that
    target in that module's forward: what ``QConfigMapping.set_module_name_object_type_order`` takes."""

    owner: str
    target: str
    index: int = attrs.field(validator=attrs.validators.ge(0))

    @property
    def name(self) -> str:
        """The site's name: ``encoder.layer.0.output.add#0`` (no module name holds ``#``)."""
        op = self.target.rsplit(".", 1)[-1]
        return f"{self.owner}.{op}#{self.index}" if self.owner else f"{op}#{self.index}"

    @property
    def is_method(self) -> bool:
        """A tensor method (``x.softmax(-1)``): FX configures those per module or per name, not per call."""
        return "." not in self.target


def call_site_name(module: str, occurrence: int) -> str:
    """The name of a module's ``occurrence``-th call in a forward: ``act`` for the first (the module's own
    name, as before calls were sites), ``act#1`` for the second. No module name holds ``#``."""
    return module if occurrence == 0 else f"{module}#{occurrence}"


def called_module(name: str) -> str:
    """The module a module call's site name names (``act#1`` -> ``act``), which is also its first call's
    site, where the calls of one module keep their shared weight's observations."""
    return name.partition("#")[0]


@attrs.frozen(kw_only=True)
class OpSite:
    """One quantizable operation of a model, as a frontend found it.

    ``fqn`` is the float model's module name (the parent of a fused module,
    ``fc1`` rather than ``fc1.0``), or a functional call's name (``call``);
    ``calls`` is how many times one forward pass runs it; ``groups`` is a
    convolution's group count (1 otherwise); ``weight_scheme`` is what the
    model's qconfig (or the qconfig mapping the user passed) would do with its
    weight, ``None`` when no qconfig applies. ``quantized`` says whether the
    flow would quantize the op at all (a site it leaves float is still listed);
    ``input_rank`` is the rank of the tensor it was seen with, where the
    frontend ran the model or read it from the graph (``None`` where it did not).
    ``source`` is the site whose output is its (first) input, and ``clip`` the bounds of
    a hardtanh (ReLU6) that alone reads its output, past a BatchNorm or ReLU FX fuses, where
    the FX frontend found them in the graph (``None`` otherwise, and in files before 1.11).

    A site is a call, not a module: a module called at several places of a forward (one ``nn.ReLU6``
    after two convs, a Linear applied twice) is a site per call, each with its own observers,
    findings and decisions. ``occurrence`` says which call of its module the site is (0, the first,
    is named after the module, the others ``act#1``..., :func:`call_site_name`); :attr:`module` is the
    module's name. Calls of one module share its weight, observed once.
    """

    fqn: str
    kind: OpKind
    module_type: str
    calls: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    groups: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    weight_scheme: WeightScheme | None = None
    call: OpCall | None = None
    quantized: bool = True
    input_rank: int | None = None
    source: str | None = None
    clip: tuple[float, float] | None = None
    occurrence: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    @property
    def module(self) -> str:
        """The name of the module whose call this site is (a functional call's site: its own name)."""
        return called_module(self.fqn) if self.occurrence else self.fqn

    @property
    def axis(self) -> int | None:
        """The channel axis of an op without a weight, from its input's rank: 1 for 4-D and 5-D
        (images, video), else the last (tokens); ``None`` for a layer, or where the rank is unknown."""
        if self.kind.is_layer or self.input_rank is None:
            return None
        return 1 if self.input_rank >= 4 else -1

    @property
    def channel_axis(self) -> int:
        return self.kind.channel_axis if self.axis is None else self.axis


@attrs.frozen(kw_only=True)
class ObserverSpec:
    """What an observer computes beyond the always-on range statistics.

    ``channel_axis`` is resolved (never "default") so that two specs that
    would observe the same data along the same axis compare equal.
    """

    channel_axis: int
    per_channel: bool = False
    moments: bool = False
    # Reference percentiles (0 < p < 1) for per-channel max/percentile ratios;
    # sorted and unique, so equal requests give equal specs. They imply per_channel.
    percentiles: tuple[float, ...] = ()
    # At most this many samples per channel and batch for the percentiles
    # (a seeded random subset); None computes them on every sample (exact).
    percentile_samples: int | None = None
    # The heavy-tail statistics LLM quantization reads (TailStats); per channel, so they imply per_channel.
    tails: bool = False
    # A weight's error in each of these torchao formats (names such as "int4_g32"; sorted and unique):
    # measured on the weight side only, once, from the weight itself (FormatError).
    formats: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if any(not 0.0 < p < 1.0 for p in self.percentiles) or list(self.percentiles) != sorted(set(self.percentiles)):
            raise InvalidValueError(f"percentiles must be sorted, unique and in (0, 1), not {self.percentiles}")
        if (self.percentiles or self.tails) and not self.per_channel:
            raise InvalidValueError("percentile and tail statistics are per channel: set per_channel=True")
        if list(self.formats) != sorted(set(self.formats)):
            raise InvalidValueError(f"formats must be sorted and unique, not {self.formats}")
        if self.percentile_samples is not None and self.percentile_samples < 1:
            raise InvalidValueError(f"percentile_samples must be at least 1, not {self.percentile_samples}")

    def union(self, other: ObserverSpec) -> ObserverSpec:
        """The spec that computes everything either spec computes."""
        if other.channel_axis != self.channel_axis:
            raise InvalidValueError("specs along different channel axes cannot be combined")
        return ObserverSpec(
            channel_axis=self.channel_axis,
            per_channel=self.per_channel or other.per_channel,
            moments=self.moments or other.moments,
            percentiles=tuple(sorted(set(self.percentiles) | set(other.percentiles))),
            percentile_samples=_finer(self, other),
            tails=self.tails or other.tails,
            formats=tuple(sorted(set(self.formats) | set(other.formats))),
        )


def _finer(a: ObserverSpec, b: ObserverSpec) -> int | None:
    """The more precise sample limit of the specs that compute percentiles (None, exact, is the most
    precise); a spec without percentiles has no say, or an equalization observer's per-channel request
    would make every outlier percentile on the same input exact, and slow."""
    limits = [spec.percentile_samples for spec in (a, b) if spec.percentiles]
    return None if not limits or None in limits else max(limit for limit in limits if limit is not None)


@attrs.frozen(kw_only=True)
class InsertPoint:
    """A request to observe one side of one op site with one spec."""

    fqn: str
    side: Side
    spec: ObserverSpec

    @classmethod
    def at(
        cls,
        site: OpSite,
        side: Side,
        *,
        per_channel: bool = False,
        moments: bool = False,
        percentile: float | None = None,
        percentile_samples: int | None = None,
        channel_axis: int | None = None,
        tails: bool = False,
        formats: tuple[str, ...] = (),
    ) -> InsertPoint:
        """An insert point on ``site``, along its kind's channel axis by default.

        A ``percentile`` asks for per-channel max/percentile ratios, ``tails``
        for the heavy-tail statistics (both imply per-channel statistics);
        ``formats`` (the weight side) for the weight's error in those torchao formats.
        """
        if formats and side is not Side.WEIGHT:
            raise InvalidValueError(
                f"a format's error is a weight's statistic: formats on the {side.value} side of {site.fqn}"
            )
        axis = site.channel_axis if channel_axis is None else channel_axis
        # the calls of one module share its weight: one observer, at the module's first call
        fqn = called_module(site.fqn) if side is Side.WEIGHT else site.fqn
        spec = ObserverSpec(
            channel_axis=axis,
            per_channel=per_channel or percentile is not None or tails,
            moments=moments,
            percentiles=() if percentile is None else (percentile,),
            percentile_samples=percentile_samples,
            tails=tails,
            formats=tuple(sorted(set(formats))),
        )
        return cls(fqn=fqn, side=side, spec=spec)

    @property
    def slot(self) -> tuple[str, Side, int]:
        """Insert points with the same slot share one observer."""
        return (self.fqn, self.side, self.spec.channel_axis)


def observer_key(fqn: str, side: Side, channel_axis: int, default_axis: int) -> str:
    """A unique, readable name for the observer in one slot: ``fc1:pre``."""
    key = f"{fqn}:{side.value}"
    if channel_axis != default_axis:
        key += f"[axis={channel_axis}]"
    return key
