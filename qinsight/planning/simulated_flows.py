"""The two flows a plan targets, behind one interface: quantize a model for real with given advice
(``prepare``/calibrate/``convert``), and build the switchable :class:`~qinsight.planning.simulate.Simulation`.

- FX: the advice is a ``QConfigMapping`` (:func:`~qinsight.apply.qconfigs.advice_entries`);
  the prepared graph's nodes are named as the report names its sites (module
  names; functional calls by owner, call and index, which ``prepare_fx``
  records in ``node_name_to_scope``); an edge belongs to the site producing it
  and the sites consuming it.
- PT2E: the advice is the backend's quantizer (:func:`~qinsight.apply.pt2e.backend_quantizer`:
  X86InductorQuantizer, XNNPACKQuantizer);
  nodes are named by the exported frontend; which edges are quantized under a
  config is the quantizer's own answer, asked again on the prepared graph
  without its observers (a consumer's input spec, a producer's output spec).
"""

from __future__ import annotations

import copy
import functools
import itertools
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.ao.quantization import QConfigMapping
from torch.ao.quantization.quantize_fx import prepare_fx

from qinsight.apply.equalization_qconfig import equalization_qconfig_mapping
from qinsight.apply.qconfigs import advice_mapping
from qinsight.apply.recipe import calibrate, prepared, torch_config, varying_shapes
from qinsight.apply.torch_flows import TORCH_FLOWS
from qinsight.apply.trial import Trial, run_trial
from qinsight.core.advice import Advice
from qinsight.core.backend import Lowering, get_backend
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.errors import FrontendError
from qinsight.core.flows import FlowSpec, check_flow_backend, flow_spec
from qinsight.core.fx_activations import FxActivations
from qinsight.core.precision import activation_bits
from qinsight.core.sites import FlowName, OpSite
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.frontends import classify, example_inputs, exported_site_names, layer_names
from qinsight.frontends.edges import site_nodes
from qinsight.planning.annotation import ExportedPatterns
from qinsight.planning.kernels import QuantizedOps
from qinsight.planning.observed import FxObserved, no_stack_traces
from qinsight.planning.pt2e_groups import GroupQParams, Signature, groups
from qinsight.planning.simulate import (
    Edge,
    EdgeRule,
    Owners,
    QParams,
    RealOps,
    Regroup,
    Simulation,
    WeightSwap,
    observed_input,
    observer_nodes,
)
from qinsight.planning.switches import Mode, fake_quantized_rows, fake_quantized_weight

_ANNOTATION = "quantization_annotation"


class Flow:
    """How one flow quantizes a model with some advice, for real and as a simulation.

    Everything a plan does differently per flow is here: which backends it takes, how it observes
    activations, the activation bits smoothing aims at, equalization, what a config is. A flow is
    whole once constructed: ``batches`` (every batch it will see) tell it the inputs' shapes.
    """

    name: FlowName
    dynamic_max = 255  # the top of a dynamic activation's range

    def __init__(
        self,
        model: nn.Module,
        sites: tuple[OpSite, ...],
        backend: str,
        batches: Sequence[object],
        activations: FxActivations | None = None,
        lowering: Lowering | None = None,
        quantizer: Any = None,
    ) -> None:
        check_flow_backend("plan", self.name, backend)
        self.model, self.sites, self.backend = model, sites, backend
        self.activations = activations  # how FX observes activations (None: torch's default; PT2E: unused)
        self.lowering = lowering  # where configs are scored as the program the backend runs (plan(lowered=True))
        self.quantizer = quantizer  # the user's, every config starts from (plan(quantizer=)); None: qinsight's
        self.names = {site.fqn for site in sites}
        self.batches = batches  # every batch the flow's models run on: an exported model takes their shapes
        self.dynamic_shapes = self.shapes(batches)

    @property
    def spec(self) -> FlowSpec:  # what the flow can express (equalization, the report's activation observing)
        return flow_spec(self.name)

    def shapes(self, batches: Sequence[object]) -> Any:
        """What ``torch.export`` needs to know of the inputs' shapes (PT2E's dynamic dimensions)."""
        return None

    def observing(self, activations: FxActivations | None) -> FxActivations | None:
        """The report's way of observing activations, where this flow has a choice (FX); ``None``: none."""
        return None

    def smoothing_bits(self) -> int:
        """The bits a Linear's input gets under this flow's static activations, what smoothing aims at."""
        return activation_bits(self.backend)

    def config(self, suggestions: tuple[QuantSuggestion, ...]) -> object:
        """The torch config applying ``suggestions``: a QConfigMapping (FX), or a quantizer (PT2E: the
        backend's, or the user's with the float sites stripped), as ``qinsight.quantize`` builds it."""
        return torch_config(self.advice(suggestions), self.quantizer, owner="plan")

    def owners(self, model: fx.GraphModule) -> Callable[[fx.Node], Owners]:
        raise NotImplementedError

    def weights(self, model: fx.GraphModule) -> dict[str, WeightSwap]:
        return {}

    def equalization(self, suggestions: tuple[QuantSuggestion, ...]) -> QConfigMapping | None:
        """prepare_fx's ``_equalization_config`` for the suggestions that say equalize; ``None``: the flow
        has no input-weight equalization."""
        equalization = self.advice(suggestions).equalization
        return equalization_qconfig_mapping(equalization) if self.spec.equalizes else None

    def advice(self, suggestions: tuple[QuantSuggestion, ...]) -> Advice:
        """The advice a user would quantize with for ``suggestions`` in this flow: its config is
        :meth:`config`'s, quantized for real through :func:`~qinsight.apply.trial.run_trial`."""
        return Advice(
            flow=self.name,
            backend=self.backend,
            sites=self.sites,
            suggestions=suggestions,
            fx_activations=self.observing(self.activations),
            equalization=EqualizationMapping.of(suggestions) if self.spec.equalizes else EqualizationMapping(),
            source="plan",
        )

    def trial(
        self, suggestions: tuple[QuantSuggestion, ...], calibration: Sequence[object], scored: Sequence[object]
    ) -> Trial:
        """``suggestions``' config quantized for real (prepare, calibrate, convert) on ``calibration`` and
        run on ``scored`` as the user ships it (the reference, or the program lowered from it)."""
        return run_trial(
            self.model,
            self.advice(suggestions),
            calibration,
            scored,
            quantizer=self.quantizer,
            lowering=self.lowering,
            shaped_for=self.batches,
        )

    def unlowered(self) -> Flow:
        """This flow scoring the reference model its configs convert to, not the program lowered from it."""
        reference = copy.copy(self)
        reference.lowering = None
        return reference

    def _prepared(self, suggestions: tuple[QuantSuggestion, ...], example: tuple[Any, ...]) -> fx.GraphModule:
        """:meth:`prepare`, its failures (tracing, export, a quantizer that refuses a pattern) said as one."""
        try:
            config, equalization = self.config(suggestions), self.equalization(suggestions)
        except Exception as exc:  # a quantizer that cannot be built for these sites
            raise FrontendError(
                f"the {self.name} flow cannot prepare {type(self.model).__name__}: {type(exc).__name__}: {exc}"
            ) from exc
        graph, _flow = prepared(self.name, self.model, config, example, self.dynamic_shapes, equalization)
        return typing.cast(fx.GraphModule, graph)  # prepare_fx and prepare_pt2e both give a GraphModule

    def simulation(self, calibration: Sequence[object]) -> Simulation:
        """The model prepared with the flow's default advice, calibrated, every observer switchable."""
        example = example_inputs(calibration[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = self._prepared((), example)
        calibrate(prepared, calibration)
        rule, regroup = self.observed(prepared, calibration)  # from the graph as prepared, before the switches go in
        real_ops = self.real_ops(prepared)
        return Simulation(
            prepared, self.owners(prepared), self.weights(prepared), rule, self.dynamic_max, real_ops, regroup
        )

    def real_ops(self, prepared: fx.GraphModule) -> RealOps | None:
        """What runs on quantized tensors in the simulation of the calibrated ``prepared`` graph, as
        the flow's converted model runs it; ``None``: fake quantization in float is exact already."""
        return None

    def observed(self, prepared: fx.GraphModule, calibration: Sequence[object]) -> tuple[EdgeRule, Regroup | None]:
        """The flow's own answer to which edges it quantizes under each config, and with which
        qparams where they differ from those ``prepared`` was calibrated with (``None``: never)."""
        raise NotImplementedError


class FxFlow(Flow):
    name: FlowName = "fx"

    def observing(self, activations: FxActivations | None) -> FxActivations | None:
        """The report's FX activation observing (8 bits, clip-aware), to be measured against torch's way."""
        return activations

    def smoothing_bits(self) -> int:
        """8 bits under the report's observing; torch's default FX config's otherwise (7 on x86, fbgemm)."""
        return activation_bits(self.backend, torch_default=self.activations is None)

    @property
    def dynamic_max(self) -> int:  # type: ignore[override]
        """fbgemm's dynamic Linear reduces its input to 7 bits (x86 and fbgemm backends)."""
        return 127 if get_backend(self.backend).reduced_range else 255

    def _site_of(self, model: fx.GraphModule) -> Callable[[fx.Node], str | None]:
        scope = model.meta["_observed_graph_module_attrs"].node_name_to_scope
        return site_nodes(model.graph, self.sites, lambda node: str(scope.get(node.name, ("", None))[0])).get

    def owners(self, model: fx.GraphModule) -> Callable[[fx.Node], Owners]:
        """Owners by the graph's shape: the site producing the edge and the sites consuming it, through
        ops that are no sites (a flatten, a dropout) and the observers FX puts around those. A site
        whose output FX does not observe is not quantized (a softmax whose qconfig its pattern
        refuses): it owns nothing, and ownership does not pass through it."""
        site_of = self._site_of(model)
        quantized = {observer.args[0] for observer in observer_nodes(model)}

        def through(node: fx.Node, step: Callable[[fx.Node], list[fx.Node]], found: set[str], depth: int = 0) -> None:
            for nxt in step(node):
                name = site_of(nxt)
                if name is not None:
                    if nxt in quantized:
                        found.add(name)
                elif depth < 16:
                    through(nxt, step, found, depth + 1)

        def owners(observer: fx.Node) -> Owners:
            source = observed_input(observer)
            producers: set[str] = set()
            through(observer, lambda n: [a for a in n.all_input_nodes if n.op != "placeholder"][:1], producers)
            consumers: set[str] = set()
            through(observer, lambda n: list(n.users), consumers)
            return Owners(next(iter(producers), None), consumers, weight=source.op == "get_attr")

        return owners

    def observed(self, prepared: fx.GraphModule, calibration: Sequence[object]) -> tuple[EdgeRule, Regroup]:
        """prepare_fx itself, asked for each config: which edges it observes depends on the neighbours
        (an op that is no site but takes the global qconfig quantizes its input whatever its
        producer does: a transpose, a clamp), and which observers it shares on the config (see
        :mod:`.observed`)."""
        example = example_inputs(calibration[0])

        def prepare(modes: Mapping[str, Mode]) -> fx.GraphModule:
            # the model's own weights, not a copy: a search asks for hundreds of configs, and preparing
            # neither changes a weight nor keeps one (conv-bn folding writes a new conv)
            tensors = itertools.chain(self.model.parameters(), self.model.buffers())
            shallow = copy.deepcopy(self.model, {id(tensor): tensor for tensor in tensors}).eval()
            with warnings.catch_warnings(), no_stack_traces():
                warnings.simplefilter("ignore")
                config = advice_mapping(self.sites, mode_suggestions(modes), self.backend, None, self.activations)
                prepared = prepare_fx(shallow, config, example)
            return prepared

        observed = FxObserved(prepare, lambda model: calibrate(model, calibration), prepared)
        return observed.edges, observed.qparams

    def real_ops(self, prepared: fx.GraphModule) -> RealOps:
        """fbgemm's integer kernels round otherwise than fake quantization in float: the layers run
        convert_fx's static quantized modules (converted from a copy), the other ops the quantized
        forms FX gives them (:mod:`.kernels`)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = typing.cast(fx.GraphModule, TORCH_FLOWS[self.name].convert(copy.deepcopy(prepared)))
        modules = dict(converted.named_modules())
        kernels = {
            name: module
            for node in prepared.graph.nodes
            if node.op == "call_module"
            and (module := modules.get(name := str(node.target))) is not None
            and _static_kernel(module)
        }
        site_of = self._site_of(prepared)
        sites = {node: site for node in prepared.graph.nodes if (site := site_of(node)) is not None}
        float_ops = {node.name for node in converted.graph.nodes if any(map(_is_dequantize, node.all_input_nodes))}
        return functools.partial(QuantizedOps, kernels=kernels, site_of=sites, float_ops=float_ops)

    def weights(self, model: fx.GraphModule) -> dict[str, WeightSwap]:
        qconfigs = model.meta["_observed_graph_module_attrs"].node_name_to_qconfig
        swaps: dict[str, WeightSwap] = {}
        for node in model.graph.nodes:
            if node.op != "call_module" or qconfigs.get(node.name) is None:
                continue
            module = model.get_submodule(str(node.target))
            if isinstance(module, nn.Embedding):  # float-qparams weight-only: 8 bits per row
                weight = module.weight.detach().clone()
                swaps[str(node.target)] = (module, weight, fake_quantized_rows(weight))
                continue
            found = classify(module)
            if found is None:
                continue
            holder = found[1]
            weight = holder.get_parameter("weight").detach().clone()
            scheme = getattr(qconfigs[node.name].weight(), "qscheme", torch.per_tensor_symmetric)
            per_channel = scheme in (torch.per_channel_symmetric, torch.per_channel_affine)
            swaps[str(node.target)] = (holder, weight, fake_quantized_weight(weight, per_channel))
        return swaps


class Pt2eFlow(Flow):
    name: FlowName = "pt2e"

    def shapes(self, batches: Sequence[object]) -> Any:
        """Export with every input dimension that differs between ``batches`` dynamic (token counts)."""
        return varying_shapes(batches)

    def observed(self, prepared: fx.GraphModule, calibration: Sequence[object]) -> tuple[EdgeRule, Regroup]:
        """The quantizer itself, asked again for each config: whether an edge is quantized depends on
        the neighbours (X86InductorQuantizer quantizes an add only fused with a quantized conv, a pool
        only after a quantized op), which no per-edge ownership captures, and which edges share an
        observer too (:mod:`.pt2e_groups`: a float conv's hardtanh observed alone). Annotating the
        prepared graph without its observers takes milliseconds; a group the default lacks is
        calibrated once."""
        bare = _without_observers(prepared)
        patterns = ExportedPatterns()  # this simulation's: hundreds of configs, each pattern exported once
        last: dict[frozenset[tuple[str, Mode]], tuple[dict[Edge, Mode], dict[Edge, tuple[Signature, Any]]]] = {}

        def annotated(modes: Mapping[str, Mode]) -> tuple[dict[Edge, Mode], dict[Edge, tuple[Signature, Any]]]:
            key = frozenset(modes.items())
            if key not in last:  # the rule and the regroup ask of one config in turn: annotated once
                last.clear()
                last[key] = self._annotated(bare, modes, patterns)
            return last[key]

        default = annotated({})[1]
        qparams = GroupQParams(bare, calibration)

        def regrouped(modes: Mapping[str, Mode]) -> dict[Edge, QParams]:
            edges, now = annotated(modes)
            moved = {
                edge: found
                for edge, found in now.items()
                if edges.get(edge) is Mode.STATIC and default.get(edge, (None,))[0] != found[0]
            }
            known = qparams(dict(moved.values()))
            return {edge: found for edge, (signature, _) in moved.items() if (found := known[signature]) is not None}

        return (lambda modes: annotated(modes)[0]), regrouped

    def _annotated(
        self, bare: fx.GraphModule, modes: Mapping[str, Mode], patterns: ExportedPatterns
    ) -> tuple[dict[Edge, Mode], dict[Edge, tuple[Signature, Any]]]:
        """The edges the config of ``modes`` quantizes, as its quantizer annotates ``bare``, and their groups."""
        for node in bare.graph.nodes:
            node.meta.pop(_ANNOTATION, None)
        with warnings.catch_warnings(), patterns.installed():
            warnings.simplefilter("ignore")  # sites the quantizer cannot honour were said with the report
            self.config(mode_suggestions(modes)).annotate(bare)  # type: ignore[attr-defined]
        edges: dict[Edge, Mode] = {}
        for node in bare.graph.nodes:
            annotation = node.meta.get(_ANNOTATION)
            for source, spec in getattr(annotation, "input_qspec_map", {}).items():
                if spec is not None:  # a bias the quantizer leaves in float
                    edges[source.name, node.name] = _spec_mode(spec)
            output = getattr(annotation, "output_qspec", None)
            if output is not None:
                for user in node.users:
                    edges.setdefault((node.name, user.name), _spec_mode(output))
        return edges, groups(bare) or {}

    def owners(self, model: fx.GraphModule) -> Callable[[fx.Node], Owners]:
        layers = layer_names(model)
        names = {
            node: name for node, name in exported_site_names(model).items() if name in self.names or node in layers
        }

        def owners(observer: fx.Node) -> Owners:
            source = observed_input(observer)
            consumers = [
                names[user]
                for user in observer.users
                if user in names and source in getattr(user.meta.get(_ANNOTATION), "input_qspec_map", {})
            ]
            annotation = source.meta.get(_ANNOTATION)
            producer = names.get(source) if getattr(annotation, "output_qspec", None) is not None else None
            return Owners(producer, consumers, weight=source.op == "get_attr")

        return owners


def mode_suggestions(modes: Mapping[str, Mode]) -> tuple[QuantSuggestion, ...]:
    """The advice that runs sites in ``modes``: float sites kept float, dynamic ones made dynamic."""
    return tuple(
        QuantSuggestion(fqn=site, keep_float=True, sources=("qinsight.plan",))
        if mode is Mode.FLOAT
        else QuantSuggestion(fqn=site, activation=ActivationMode.DYNAMIC, sources=("qinsight.plan",))
        for site, mode in sorted(modes.items(), key=lambda item: item[0])
        if mode is not Mode.STATIC
    )


def _static_kernel(module: nn.Module) -> bool:
    """A converted FX module that reads a quantized input and writes its own output qparams (a
    quantized Linear, Conv or LayerNorm; not a dynamic or weight-only one, not a float module)."""
    kind = type(module).__module__  # weight-only ones (embeddings) have no output scale
    return (
        kind.startswith("torch.ao.nn.") and ".quantized" in kind and ".dynamic" not in kind and hasattr(module, "scale")
    )


def _is_dequantize(node: fx.Node) -> bool:
    """A converted FX graph's ``dequantize``: what follows it runs in float."""
    return (node.op == "call_method" and node.target == "dequantize") or (
        node.op == "call_function" and node.target is torch.dequantize
    )


def _spec_mode(spec: object) -> Mode:
    return Mode.DYNAMIC if getattr(spec, "is_dynamic", False) else Mode.STATIC


def _without_observers(prepared: fx.GraphModule) -> fx.GraphModule:
    """A copy of the prepared graph's nodes (same names and metadata, shared weights) with every
    observer bypassed: the graph the quantizer annotated."""
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(prepared.graph, copies))
    for observer in observer_nodes(prepared):
        node = copies[observer]
        node.replace_all_uses_with(node.args[0])  # type: ignore[arg-type]
        graph.erase_node(node)
    return fx.GraphModule(prepared, graph)


FLOW_CLASSES: dict[FlowName, type[Flow]] = {flow.name: flow for flow in (FxFlow, Pt2eFlow)}


def flow_for(
    name: FlowName,
    model: nn.Module,
    sites: tuple[OpSite, ...],
    backend: str,
    batches: Sequence[object],
    activations: FxActivations | None = None,
    lowering: Lowering | None = None,
    quantizer: Any = None,
) -> Flow:
    """The flow called ``name`` (checked by :func:`qinsight.core.sites.checked_flow`), whole."""
    return FLOW_CLASSES[name](model, sites, backend, batches, activations, lowering, quantizer)


__all__ = ["FLOW_CLASSES", "Flow", "FxFlow", "Pt2eFlow", "flow_for"]
