"""Every way of reading a model, behind one public module.

The rest of qinsight imports from here, never from the files inside:

- views for detectors and the instrumenter: :func:`view_of` picks one of
  :func:`fx_view`, :func:`exported_view`, :func:`eager_view`;
- what a model is made of (:mod:`.modules`): :func:`quantizable_modules`,
  :func:`classify`, :func:`resolve_qconfig`, :func:`weight_scheme`,
  :func:`tail_chains` and :func:`model_structure` (both read with one trace);
- exported graphs (:mod:`.exported`): their aten sites, names and taps;
- running a model (:mod:`.base`): :func:`run_batch`, :func:`eval_mode`.
"""

from qinsight.frontends.base import (
    CallIndex,
    ModelViewBase,
    ModuleView,
    batch_arguments,
    eval_mode,
    example_inputs,
    find_site,
    hookless_copy,
    run_batch,
    shared_copy,
)
from qinsight.frontends.calls import CallTap, WatchCall, hidden_calls, resolve_target
from qinsight.frontends.eager import eager_view
from qinsight.frontends.exported import (
    ATEN_KINDS,
    ATEN_OPS,
    OP_NAME_KINDS,
    ExportedView,
    call_target,
    exported_op_names,
    exported_site_names,
    exported_sites,
    exported_view,
    fetch_attr,
    layer_name,
    layer_names,
    misfit_input,
    module_name_of,
    separate_shared_calls,
    tap_each,
    tap_nodes,
    torch_layer_sources,
    weight_argument,
)
from qinsight.frontends.fx import fx_view
from qinsight.frontends.modules import (
    LeafTracer,
    ModelStructure,
    QuantizableModule,
    TailChain,
    classify,
    model_structure,
    quantizable_modules,
    resolve_qconfig,
    site_for_module,
    tail_chains,
    weight_scheme,
)
from qinsight.frontends.op_sites import Discovery
from qinsight.frontends.select import view_of

__all__ = [
    "CallIndex",
    "CallTap",
    "Discovery",
    "OP_NAME_KINDS",
    "WatchCall",
    "hidden_calls",
    "resolve_target",
    "tap_each",
    "ATEN_KINDS",
    "ATEN_OPS",
    "ExportedView",
    "LeafTracer",
    "ModelStructure",
    "ModuleView",
    "QuantizableModule",
    "ModelViewBase",
    "TailChain",
    "batch_arguments",
    "call_target",
    "classify",
    "eager_view",
    "eval_mode",
    "exported_op_names",
    "exported_site_names",
    "exported_sites",
    "exported_view",
    "fetch_attr",
    "layer_name",
    "layer_names",
    "misfit_input",
    "find_site",
    "example_inputs",
    "hookless_copy",
    "fx_view",
    "model_structure",
    "module_name_of",
    "quantizable_modules",
    "resolve_qconfig",
    "run_batch",
    "separate_shared_calls",
    "torch_layer_sources",
    "shared_copy",
    "site_for_module",
    "tail_chains",
    "tap_nodes",
    "view_of",
    "weight_argument",
    "weight_scheme",
]
