"""The FX frontend: a float ``nn.Module`` (traced for the user) or a ``prepare_fx`` GraphModule.

Sites are the ``call_module`` nodes of the graph whose module is a Linear or a
Conv1d/2d/3d (subclasses included: QAT, lazy, and the Linear/Conv inside a
fused module such as ``LinearReLU``). The site is named after the called
module, which is the float model's name (``fc1``, not ``fc1.0``). The trace is
only read: observers hook the user's own modules, so the model runs as before.
"""

from __future__ import annotations

import re
from collections import Counter

from torch import fx, nn
from torch.ao.nn.intrinsic.modules.fused import _FusedModule
from torch.ao.quantization import FakeQuantize, QConfig, QConfigMapping
from torch.ao.quantization.observer import ObserverBase

from qinsight.errors import FrontendError
from qinsight.frontends.base import ModuleView
from qinsight.sites import OpKind, OpSite, WeightScheme

_KINDS: tuple[tuple[type[nn.Module], OpKind], ...] = (
    (nn.Linear, OpKind.LINEAR),
    (nn.Conv1d, OpKind.CONV1D),
    (nn.Conv2d, OpKind.CONV2D),
    (nn.Conv3d, OpKind.CONV3D),
)


def classify(module: nn.Module) -> tuple[OpKind, nn.Module] | None:
    """The op kind of ``module`` and the module holding its weight, if it is a site."""
    # QAT fused modules (ConvBnReLU2d) are Convs themselves; inference fused
    # modules (LinearReLU) hold theirs as the first child.
    candidates = (module, module[0]) if isinstance(module, _FusedModule) else (module,)
    for candidate in candidates:
        for cls, kind in _KINDS:
            if isinstance(candidate, cls):
                return kind, candidate
    return None


def weight_scheme(qconfig: object) -> WeightScheme | None:
    """What ``qconfig`` does with a weight, with torch's ModelReport's rule."""
    if not isinstance(qconfig, QConfig):
        return None
    weight_obs = qconfig.weight()
    if isinstance(weight_obs, FakeQuantize):
        per_channel = bool(getattr(weight_obs, "is_per_channel", False))
    else:
        per_channel = isinstance(weight_obs, ObserverBase) and hasattr(weight_obs, "ch_axis")
    return WeightScheme.PER_CHANNEL if per_channel else WeightScheme.PER_TENSOR


def resolve_qconfig(mapping: QConfigMapping, fqn: str, module_type: type) -> object:
    """The qconfig ``mapping`` gives module ``fqn``.

    Precedence as in torch: module name (the module or its closest named
    parent), then name regex, then object type, then global.
    """
    parts = fqn.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in mapping.module_name_qconfigs:
            return mapping.module_name_qconfigs[prefix]
    for pattern, qconfig in mapping.module_name_regex_qconfigs.items():
        if re.match(pattern, fqn):
            return qconfig
    for object_type, qconfig in mapping.object_type_qconfigs.items():
        if module_type in (object_type,):  # a plain `is` test narrows Callable | str to Never in mypy
            return qconfig
    return mapping.global_qconfig


class _Tracer(fx.Tracer):
    """FX's tracer, but fused modules (``LinearReLU``, ...) stay leaves, as in ``prepare_fx``."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _FusedModule) or super().is_leaf_module(m, module_qualified_name)


def site_for_module(
    fqn: str, module: nn.Module, kind: OpKind, holder: nn.Module, calls: int, mapping: QConfigMapping | None
) -> OpSite:
    """The site of a called module; its weight scheme from the module's qconfig, else from ``mapping``."""
    qconfig = getattr(module, "qconfig", None)
    if qconfig is None and mapping is not None:
        qconfig = resolve_qconfig(mapping, fqn, type(holder))
    return OpSite(
        fqn=fqn,
        kind=kind,
        module_type=type(module).__name__,
        calls=calls,
        groups=int(getattr(holder, "groups", 1)),
        weight_scheme=weight_scheme(qconfig),
    )


def _graph_of(model: nn.Module) -> fx.Graph:
    if isinstance(model, fx.GraphModule):
        return model.graph
    try:
        return _Tracer().trace(model)
    except Exception as exc:  # tracing fails in many ways: report them all alike
        raise FrontendError(
            f"{type(model).__name__} cannot be FX-traced ({type(exc).__name__}: {exc}); "
            "make the model traceable or pass a prepare_fx GraphModule"
        ) from exc


def fx_view(model: nn.Module, qconfig_mapping: QConfigMapping | None = None) -> ModuleView:
    """The view of an FX-traceable model or of a ``prepare_fx`` GraphModule.

    ``qconfig_mapping`` tells which weight scheme each site would get; a
    prepared model's own ``qconfig`` attributes take precedence.
    """
    graph = _graph_of(model)
    calls = Counter(str(node.target) for node in graph.nodes if node.op == "call_module")
    sites: list[OpSite] = []
    modules: dict[str, nn.Module] = {}
    weights: dict[str, nn.Module] = {}
    for fqn, count in calls.items():  # Counter keeps first-call (forward) order
        module = model.get_submodule(fqn)
        found = classify(module)
        if found is None:
            continue
        kind, holder = found
        sites.append(site_for_module(fqn, module, kind, holder, count, qconfig_mapping))
        modules[fqn] = module
        weights[fqn] = holder
    return ModuleView(frontend="fx", model=model, sites=tuple(sites), modules=modules, weights=weights)
