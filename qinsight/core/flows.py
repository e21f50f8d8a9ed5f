"""The flows qinsight quantizes through: one torch-free table.

Every decision that differs by flow reads it: whether it has input-weight equalization, whether the
report's FX activation observing applies, which frontend's graph it prepares, which call gives a user
its config. Which flows serve a backend is the backend's record (:mod:`qinsight.core.backend`): FX
through its engine, PT2E through its quantizer, as torchao has it (X86InductorQuantizer for x86,
ExecuTorch's XNNPACKQuantizer for xnnpack, a third party's for its own), torchao's ``quantize_``
where its int8 kernels run (x86). ``quantize_`` takes the model as it is (no graph), so it quantizes
models neither FX nor ``torch.export`` take, and its per-layer formats are planned by
``qinsight.plan_formats``. A flow's torch side (its config builder, prepare and convert) is
registered under the same name in :mod:`qinsight.apply.torch_flows` and :mod:`qinsight.apply.recipe`.
"""

from __future__ import annotations

from typing import Final

import attrs

from qinsight.core.backend import Pt2eQuantizers, backend_names, find_backend, get_backend
from qinsight.core.errors import InvalidParameterError
from qinsight.core.sites import FlowName


@attrs.frozen(kw_only=True)
class FlowSpec:
    """What a flow can express, and how a user gets its config (``config_call``, ``{source}`` the
    report or plan: its builder defaults to the source's own backend)."""

    name: FlowName
    title: str
    frontend: str  # the frontend whose graph the flow prepares: a traced module (fx), an exported one, or NO_GRAPH
    equalizes: bool  # input-weight equalization (prepare_fx's _equalization_config)
    observes_activations: bool  # the report's own activation observing (FxActivations) applies
    lowers: bool  # its converted model is what a backend's Lowering takes (qinsight.compare_lowered)
    config_call: str
    converter: str  # the call that gives the quantized model, as a comparison labels it
    stand_in: str | None = None  # the backend it quantizes for when asked for one it does not serve
    plans_formats: bool = False  # qinsight.plan_formats plans it (a format per Linear), not qinsight.plan
    # it keeps one call of a module in float, the module's other calls quantized (PT2E: that call's nodes
    # lose their annotations); every other choice of a config applies to a module, all its calls alike
    floats_calls: bool = False

    def serves(self, backend: str) -> bool:
        """Whether it quantizes for ``backend`` (a backend not installed here: no flow does)."""
        record = find_backend(backend)
        return record is not None and self.name in record.flows

    def backend_for(self, owner: str, backend: str) -> str:
        """The backend this flow quantizes for when asked for ``backend``: ``backend`` where it serves
        it, else its stand-in (PT2E quantizes a report for FX's other engines with X86InductorQuantizer),
        else one :class:`InvalidParameterError` naming the flow that does serve it."""
        if self.serves(backend):
            return backend
        if self.stand_in is None:
            raise _unserved(owner, self, backend)
        return self.stand_in

    @property
    def exports(self) -> bool:
        """Whether it quantizes the graph ``torch.export`` gives (PT2E): its inputs' varying dimensions
        are exported dynamic."""
        return self.frontend == EXPORTED

    def call(self, source: str) -> str:
        """The call that builds this flow's config of ``source`` (``"report"``, ``"plan"``)."""
        return self.config_call.format(source=source)


NO_GRAPH: Final = "module"  # a FlowSpec's frontend where the flow takes the model as it is (quantize_)
EXPORTED: Final = "export"  # a FlowSpec's frontend where the flow prepares the exported graph (PT2E)

FLOW_SPECS: Final[dict[FlowName, FlowSpec]] = {
    "fx": FlowSpec(
        name="fx",
        title="FX",
        frontend="fx",
        converter="convert_fx",
        equalizes=True,
        observes_activations=True,
        lowers=False,
        config_call="qinsight.qconfig_mapping({source})",
    ),
    "pt2e": FlowSpec(
        name="pt2e",
        title="PT2E",
        frontend="export",
        converter="convert_pt2e",
        equalizes=False,
        observes_activations=False,
        lowers=True,
        config_call="qinsight.pt2e_quantizer({source})",
        stand_in="x86",
        floats_calls=True,
    ),
    "torchao": FlowSpec(
        name="torchao",
        title="torchao quantize_",
        frontend=NO_GRAPH,
        equalizes=False,
        observes_activations=False,
        lowers=False,
        config_call="qinsight.quantize(model, {source}, data, flow='torchao')",
        plans_formats=True,
        converter="quantize_",
    ),
}

_BY_NAME: Final[dict[str, FlowSpec]] = {name: spec for name, spec in FLOW_SPECS.items()}


def flow_spec(name: str) -> FlowSpec:
    """The flow called ``name`` (a :data:`~qinsight.core.sites.FlowName`; a plan read from a file holds a str)."""
    return _BY_NAME[name]


def flows_serving(backend: str, *, lowered: bool = False) -> tuple[FlowName, ...]:
    """The flows that quantize for ``backend``, FX first, torchao last (``lowered``: those whose model is lowered)."""
    record = find_backend(backend)
    if record is None:
        return ()
    lowers = record.lowering is not None
    return tuple(name for name in record.flows if (lowers and FLOW_SPECS[name].lowers) or not lowered)


def reads_as_is(frontend: str) -> bool:
    """Whether a flow prepares the graph ``frontend`` reads (a traced or an exported model); the eager
    frontend's models are those FX cannot trace."""
    return any(spec.frontend == frontend for spec in FLOW_SPECS.values())


def report_flow(frontend: str, backend: str) -> FlowName:
    """The flow a report's user quantizes with: its frontend's own (FX for a traced model, PT2E for an
    exported one) where that serves ``backend``, else the first flow serving ``backend``; for a model
    only the eager frontend reads, the flow that exports it (PT2E: ``torch.export`` takes models FX
    cannot trace)."""
    own = [spec for spec in FLOW_SPECS.values() if spec.frontend == frontend]
    if own:
        return own[0].name if own[0].serves(backend) else flows_serving(backend)[0]
    return next(spec.name for spec in FLOW_SPECS.values() if spec.exports)


def verifying_flows(frontend: str, backend: str) -> tuple[FlowName, ...]:
    """The flows a report is verified in unless told: its :func:`report_flow`; for a model only the
    eager frontend reads, every flow that takes it without FX's trace too (``quantize_``, which needs
    no graph, verifies it where ``torch.export`` cannot take it either)."""
    own = report_flow(frontend, backend)
    if reads_as_is(frontend):
        return (own,)
    return (own, *(spec.name for spec in FLOW_SPECS.values() if spec.frontend == NO_GRAPH and spec.serves(backend)))


def observes_activations(frontend: str, backend: str) -> bool:
    """Whether the report's own activation observing applies: a flow observing activations its way (FX)
    serves ``backend``, and the model is not an exported graph (a flow preparing that observes 8 bits
    after the clips already)."""
    return frontend != EXPORTED and any(s.observes_activations and s.serves(backend) for s in FLOW_SPECS.values())


def equalizes(frontend: str, backend: str) -> bool:
    """Whether a flow serving ``backend`` equalizes the model (FX's ``prepare_fx``): not an exported
    graph, which is not what ``prepare_fx`` equalizes (the user's module is)."""
    return frontend != EXPORTED and any(s.equalizes and s.serves(backend) for s in FLOW_SPECS.values())


def check_flow_backend(owner: str, flow: FlowName, backend: str) -> None:
    """One :class:`InvalidParameterError` unless ``flow`` quantizes for ``backend``, naming the backends it does."""
    if not FLOW_SPECS[flow].serves(get_backend(backend, owner).name):
        raise _unserved(owner, FLOW_SPECS[flow], backend)


def pt2e_quantizers(owner: str, backend: str) -> Pt2eQuantizers:
    """``backend``'s PT2E quantizers; one :class:`InvalidParameterError` naming the flow that serves
    it if PT2E does not."""
    quantizers = get_backend(backend, owner).pt2e
    if quantizers is None:
        raise _unserved(owner, FLOW_SPECS["pt2e"], backend)
    return quantizers


def served_by(flow: FlowName) -> tuple[str, ...]:
    """The installed backends ``flow`` quantizes for (those whose record loads: a broken one is said
    where it is asked for)."""
    return tuple(name for name in backend_names() if FLOW_SPECS[flow].serves(name))


def _unserved(owner: str, spec: FlowSpec, backend: str) -> InvalidParameterError:
    others = flows_serving(backend)
    hint = f" ({backend} is served by flow={others[0]!r})" if others else ""
    return InvalidParameterError(
        owner, "backend", backend, f"one of {', '.join(served_by(spec.name))} for flow={spec.name!r}{hint}"
    )


def fx_engine(backend: str) -> str:
    """The FX engine whose default config stands for ``backend``'s where only FX's can be read."""
    return get_backend(backend).fx_config_engine


__all__ = [
    "FLOW_SPECS",
    "NO_GRAPH",
    "FlowSpec",
    "check_flow_backend",
    "equalizes",
    "observes_activations",
    "flow_spec",
    "flows_serving",
    "pt2e_quantizers",
    "served_by",
    "fx_engine",
    "reads_as_is",
    "report_flow",
    "verifying_flows",
]
