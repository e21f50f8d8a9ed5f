"""The eager frontend: any ``nn.Module``, including models FX cannot trace.

Sites are found by running the model once on an example batch with counting
hooks on every Linear/Conv module (a fused module counts as one site, as in
FX); the same run finds the ops around them. They are ordered by first call, with calls per forward counted. Sites
are observed with the same forward hooks as the FX frontend's, so every
detector that needs only module inputs, outputs and weights (all built-in
ones) works unchanged. The discovery forward runs without gradients in eval
mode; training flags are restored.
"""

from __future__ import annotations

import attrs
from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.frontends.base import ModuleView
from qinsight.frontends.modules import quantizable_modules, site_for_module
from qinsight.frontends.ops import Discovery, op_sites


def eager_view(
    model: nn.Module, example: object, qconfig_mapping: QConfigMapping | None = None, backend: str = "x86"
) -> ModuleView:
    """The view of ``model``, with its sites and the ops around them found by calling it on ``example``
    (one batch, :class:`~qinsight.frontends.ops.Discovery`)."""
    candidates = quantizable_modules(model)
    discovery = Discovery(model, tuple(candidates)).run(example)
    sites = tuple(  # first-call order
        attrs.evolve(
            site_for_module(
                fqn, candidates[fqn].module, candidates[fqn].kind, candidates[fqn].holder, count, qconfig_mapping
            ),
            input_rank=discovery.ranks.get(fqn),
        )
        for fqn, count in discovery.layer_calls.items()
    )
    modules = {fqn: candidates[fqn].module for fqn in discovery.layer_calls}
    weights = {fqn: candidates[fqn].holder for fqn in discovery.layer_calls}
    ops = op_sites(discovery, qconfig_mapping, backend)
    modules.update({op.fqn: model.get_submodule(op.fqn) for op in ops if op.call is None})
    return ModuleView(frontend="eager", model=model, sites=sites, modules=modules, weights=weights, ops=ops)
