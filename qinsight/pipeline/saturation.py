"""Whether the backend's FX kernels saturate at 8-bit activations, measured on the model: the check
behind :class:`~qinsight.core.fx_activations.FxActivations`, run under the backend's quantized engine.

fbgemm multiplies uint8 inputs by int8 weights and adds the products pairwise
in 16 bits before widening (its depthwise kernels do, on any CPU): two inputs
near 255 against weights near 127 overflow, which is why torch's x86 default
keeps activations at 7 bits. Whether a model's inputs come near depends on its
ranges and zero points, so the model is quantized at 8 bits on a calibration
batch and each quantized Linear/Conv's output is compared with the exact
result of the same integer inputs and weights, requantized with the same
qparams (onednn's default keeps 8 bits, and torch warns that without VNNI
its kernels may lose accuracy: the check measures which case a CPU is). Rounding
leaves them at most one step apart; where the outputs further off add more error
than the rounding does, the kernel saturates, and its input goes back to 7 bits.
Narrowing changes its producer's qparams, so the model is checked again, up to a
few rounds.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import QConfigAny, QConfigMapping
from torch.ao.quantization.quantize_fx import prepare_fx
from torch.ao.quantization.utils import activation_is_dynamically_quantized

from qinsight.apply.qconfigs import advice_mapping
from qinsight.apply.torch_flows import TORCH_FLOWS, release_fx_graphs
from qinsight.core.fx_activations import FxActivations, NarrowedInput
from qinsight.core.report import Report
from qinsight.frontends import eval_mode, example_inputs, hookless_copy, run_batch, shared_copy

ROUNDS = 3  # checks after narrowing; each narrowing moves only the qparams just before a kernel
# A kernel saturates where the error beyond rounding exceeds the rounding noise of its own outputs:
# below, 8 bits still beat 7 (on MobileNetV2 with clipped observers, 9 of 53 kernels are a few
# saturated sums off, 0.0004 to 0.3 of that noise; unclipped, 4.8 to 1.6e5).
SATURATED = 1.0


def _quantized_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The converted model's static quantized Linear and Conv modules (fused ReLU included; not the
    transposed convs or the padding modes :func:`_exact` does not compute)."""
    for name, module in model.named_modules():
        kind, cls = type(module).__module__, type(module).__name__
        static = (
            ".quantized" in kind and ".dynamic" not in kind and ".reference" not in kind and hasattr(module, "scale")
        )
        plain = "Transpose" not in cls and getattr(module, "padding_mode", "zeros") == "zeros"
        if static and plain and callable(getattr(module, "_weight_bias", None)):
            yield name, module


# |x - 128| and |w| are at most 128, so the int32 sums of (x - 128) w and the correction hold 2^14 per feature each.
# (At least 2 features: torch 2.13's CPU _int_mm gives wrong sums for one, with two outputs or more.)
_INTEGER_FEATURES = 2**16 - 1


def _exact(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What ``module`` computes in exact arithmetic from its quantized input ``x``, in float."""
    weight, bias = module._weight_bias()  # type: ignore[operator]  # one unpack (weight() and bias() each unpack)
    if weight.dim() == 2 and x.dtype == torch.quint8 and 2 <= x.shape[-1] <= _INTEGER_FEATURES and _symmetric(weight):
        out = _integer_linear(x, weight, bias)
    elif weight.dim() == 2:
        out = F.linear(x.dequantize(), weight.dequantize(), bias)
    else:
        conv: Any = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[weight.dim()]
        out = conv(
            x.dequantize(), weight.dequantize(), bias, module.stride, module.padding, module.dilation, module.groups
        )
    return torch.relu(out) if "ReLU" in type(module).__name__ else out


def _symmetric(weight: torch.Tensor) -> bool:
    """Whether a qint8 weight's zero points are all 0 (per tensor or per channel): its integers are its values."""
    if weight.dtype != torch.qint8:
        return False
    if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        return not weight.q_per_channel_zero_points().any().item()
    return weight.q_zero_point() == 0


def _integer_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A quantized Linear's output in exact integer arithmetic, then scaled: the sums of ``(x - zp) * w``
    with int8 operands (``x - 128``, corrected by ``(128 - zp) * sum(w)``) and int32 sums, exact up to
    :data:`_INTEGER_FEATURES` input features. 25x faster than the float product on the CPU (4096 x 11008:
    18 against 440 ms)."""
    inputs = x.int_repr().reshape(-1, x.shape[-1])
    shifted = (inputs.to(torch.int16) - 128).to(torch.int8)
    integers = weight.int_repr().t()
    sums = torch._int_mm(shifted, integers) + (128 - x.q_zero_point()) * integers.sum(dim=0, dtype=torch.int32)
    if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        scales = weight.q_per_channel_scales().double() * x.q_scale()
    else:
        scales = torch.tensor(weight.q_scale() * x.q_scale(), dtype=torch.float64)
    out = sums.double() * scales + (bias.double() if bias is not None else 0.0)
    return out.float().reshape(*x.shape[:-1], -1)


def _excess(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The error ``module``'s outputs ``y`` carry beyond rounding (the outputs more than one step from
    the exact result), as a multiple of the rounding noise every quantized output has (1/12 step²)."""
    exact = torch.quantize_per_tensor(_exact(module, x), y.q_scale(), y.q_zero_point(), y.dtype)
    steps = (exact.int_repr().int() - y.int_repr().int()).float()
    beyond = torch.where(steps.abs() > 1, steps, 0.0)
    return float(beyond.square().mean()) * 12.0


def saturated(converted: nn.Module, example: object) -> tuple[dict[str, float], int]:
    """Per quantized Linear/Conv whose outputs on ``example`` are off by more than a step, its
    :func:`_excess` (the largest over its calls); and how many kernels ran."""
    found: dict[str, float] = {}
    seen: set[str] = set()

    def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def compare(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen.add(name)
            if args and isinstance(args[0], torch.Tensor) and args[0].is_quantized and output.is_quantized:
                excess = _excess(module, args[0], output)
                if excess > 0.0:
                    found[name] = max(excess, found.get(name, 0.0))

        return compare

    handles = [module.register_forward_hook(hook(name)) for name, module in _quantized_layers(converted)]
    try:
        with torch.no_grad():
            run_batch(converted, example)
    finally:
        for handle in handles:
            handle.remove()
    return found, len(seen)


def static_only(mapping: QConfigMapping) -> QConfigMapping:
    """``mapping`` with its dynamic entries kept in float: the check runs the static kernels alone. A
    dynamic Linear's input is float either way, so the static kernels see the same inputs and qparams,
    and its weight is not packed for nothing (9 of the 42 s a check of four 7B-width layers took)."""
    static = copy.deepcopy(mapping)
    tables: list[dict[Any, QConfigAny]] = [
        static.object_type_qconfigs,
        static.module_name_regex_qconfigs,
        static.module_name_qconfigs,
        static.module_name_object_type_order_qconfigs,
    ]
    for table in tables:
        for key, qconfig in table.items():
            if _dynamic(qconfig):
                table[key] = None
    if _dynamic(static.global_qconfig):
        static.global_qconfig = None
    return static


def _dynamic(qconfig: QConfigAny) -> bool:
    return qconfig is not None and bool(activation_is_dynamically_quantized(qconfig))  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """torch's quantized kernels for ``backend`` while the block runs, where this build has them:
    a converted model packs its weights for, and runs, the engine set at conversion."""
    before = torch.backends.quantized.engine
    if backend in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = backend
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def checked_activations(
    model: nn.Module, example: object, backend: str, mapping_for: Callable[[FxActivations], QConfigMapping]
) -> FxActivations | None:
    """8-bit clip-aware FX activations for ``model``, with the inputs of the kernels that saturate at 8
    bits narrowed to 7 (measured on ``example``, with the backend's own kernels); ``None`` where the
    model does not quantize through FX."""
    if any(tensor.device.type != "cpu" for tensor in itertools.chain(model.parameters(), model.buffers())):
        # FX's quantized kernels (fbgemm, onednn) run on the CPU alone: a model on an accelerator fails
        # its conversion, after two copies of it on the device, a trace, a prepare and a calibration
        return None
    inputs = example_inputs(example)
    activations = FxActivations()
    model = hookless_copy(model)  # a session's observers may be on the model: they see nothing of this
    for _ in range(ROUNDS):
        try:
            with warnings.catch_warnings(), eval_mode(model), quantized_engine(backend):
                warnings.simplefilter("ignore")
                prepared = prepare_fx(shared_copy(model), static_only(mapping_for(activations)), inputs)
                with torch.no_grad():
                    run_batch(prepared, example)
                off, kernels = saturated(TORCH_FLOWS["fx"].convert(prepared), example)
            release_fx_graphs()
        except Exception:
            return None  # FX cannot quantize it: its config stays torch's
        new = [
            NarrowedInput(fqn=fqn, excess=excess)
            for fqn, excess in off.items()
            if excess > SATURATED and fqn not in activations.narrowed_fqns
        ]
        activations = FxActivations(narrowed=activations.narrowed + tuple(new), kernels=kernels)
        if not new:
            break
    return activations


def kernels_checked(model: nn.Module, report: Report, example: object) -> Report:
    """``report`` with its FX activation observing checked (:func:`checked_activations`) on ``example``,
    under the report's own config; as it is where there is nothing to check or it was checked."""
    unchecked = report.fx_activations
    if unchecked is None or unchecked.checked:
        return report
    backend = report.metadata.backend

    def mapping(activations: FxActivations) -> QConfigMapping:
        return advice_mapping(report.sites, report.suggestions, backend, None, activations)

    return attrs.evolve(report, fx_activations=checked_activations(model, example, backend, mapping))


__all__ = ["checked_activations", "kernels_checked", "saturated", "static_only"]
