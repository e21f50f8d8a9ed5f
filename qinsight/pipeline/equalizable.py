"""Which suggested equalizations torch can apply: each one applied by ``prepare_fx``'s own
input-weight equalization and checked to leave what the float model computes unchanged.

Equalization scales a layer's input columns by ``1/s`` and its weight columns
by ``s``. Where a float ``mul`` cannot carry ``1/s`` (the input comes from a
layer or a ReLU), torch folds it into the producer's weights instead, but only
when the producer is equalized too and torch finds the chain; otherwise the
scale is silently lost and the model computes something else (a conv after a
fused conv-bn-relu reads -3 dB instead of 31 dB). Where prepare_fx inserts no
equalization at all (a layer whose input also feeds an add), nothing happens.
Rules for these cases would be torch's internals restated; instead each
equalization is applied for real on a copy, the quantization left out
(observers pass values through), and the float outputs compared.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import fx, nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig_mapping
from torch.ao.quantization.fx._equalize import (
    _convert_equalization_ref,
    _InputEqualizationObserver,
    default_equalization_qconfig,
)
from torch.ao.quantization.quantize_fx import prepare_fx

from qinsight.apply.torch_flows import release_fx_graphs
from qinsight.compare.metric_functions import relative_l2
from qinsight.core.errors import describe
from qinsight.core.flows import fx_engine
from qinsight.frontends import eval_mode, example_inputs, hookless_copy, run_batch, shared_copy

# The float output may move by rounding only: scaling by s and 1/s is exact up to float32.
CHANGED = 1e-3
SKIPPED = "torch skips it: prepare_fx inserts no equalization observer at its input"


def refused_equalizations(model: nn.Module, fqns: Sequence[str], example: object, backend: str) -> dict[str, str]:
    """Of ``fqns`` (in forward order), the ones torch cannot equalize, with the reason. Taken in
    order, each is tried together with the ones kept before it, so the kept set is checked as a whole."""
    if not fqns:
        return {}
    model = hookless_copy(model)  # a session's observers may be on the model: they see nothing of this
    with eval_mode(model), torch.no_grad():
        reference = _float_leaves(run_batch(model, example))
    kept: list[str] = []
    refused: dict[str, str] = {}
    equalizers = 0  # input equalization observers prepare_fx inserts for the kept ones
    for fqn in fqns:
        try:
            prepared = _prepared(model, [*kept, fqn], example, backend)
            inserted = len(_input_equalizers(prepared))
            reason = SKIPPED if inserted == equalizers else _changed(prepared, fqn, example, reference)
        except Exception as exc:
            reason = f"torch equalizes only through prepare_fx, which cannot prepare this model ({describe(exc)})"
        if reason:
            refused[fqn] = reason
        else:
            kept.append(fqn)
            equalizers = inserted
    release_fx_graphs()
    return refused


def _changed(prepared: fx.GraphModule, fqn: str, example: object, reference: torch.Tensor) -> str:
    """Why the equalizations ``prepared`` carries (``fqn`` the newest) change the float model's
    output; empty where they do not."""
    producer = _producer(prepared, fqn)
    with torch.no_grad():
        run_batch(prepared, example)  # the scales come from this batch's ranges
        equalized = _float_leaves(run_batch(_convert_equalization_ref(prepared), example))
    change = relative_l2(reference, equalized) if reference.shape == equalized.shape else math.inf
    if change <= CHANGED:
        return ""
    return (
        f"torch's equalization changes the float model's output by {change:.0%} (relative L2): the scale it "
        f"takes from the input, which comes from {producer}, is not carried back into that producer"
    )


def _prepared(model: nn.Module, fqns: Sequence[str], example: object, backend: str) -> fx.GraphModule:
    inputs = example_inputs(example)
    equalization = QConfigMapping()
    for name in fqns:
        # torch keeps EqualizationQConfigs in a QConfigMapping, though its annotations admit only QConfig
        equalization.set_module_name(name, default_equalization_qconfig)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_fx(
            shared_copy(model).eval(),
            get_default_qconfig_mapping(fx_engine(backend)),
            inputs,
            _equalization_config=equalization,
        )
    return prepared


def _input_equalizers(prepared: fx.GraphModule) -> list[fx.Node]:
    modules = dict(prepared.named_modules())
    return [
        node
        for node in prepared.graph.nodes
        if node.op == "call_module" and isinstance(modules.get(str(node.target)), _InputEqualizationObserver)
    ]


def _producer(prepared: fx.GraphModule, fqn: str) -> str:
    """What produces the equalized layer's input, as the prepared graph names it
    (equalizer <- input observer <- producer)."""
    for node in _input_equalizers(prepared):
        if any(user.op == "call_module" and str(user.target) == fqn for user in node.users):
            observer = node.args[0]
            if isinstance(observer, fx.Node) and observer.args and isinstance(observer.args[0], fx.Node):
                source = observer.args[0]
                return f"`{source.target}`" if source.op == "call_module" else f"`{source.name}`"
    return "another op"


def _float_leaves(output: object) -> torch.Tensor:
    """Every floating tensor of a model output, flattened into one."""
    leaves = torch.utils._pytree.tree_leaves(output)
    return torch.cat(
        [t.detach().float().reshape(-1) for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    )


__all__ = ["CHANGED", "refused_equalizations"]
