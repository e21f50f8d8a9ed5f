"""The eager frontend: any ``nn.Module``, including models FX cannot trace.

Sites are found by running the model once on an example batch with counting
hooks on every Linear/Conv module (a fused module counts as one site, as in
FX); the same run finds the ops around them. Each call is a site, in call order (a module called twice:
``act`` and ``act#1``). Sites
are observed with the same forward hooks as the FX frontend's, so every
detector that needs only module inputs, outputs and weights (all built-in
ones) works unchanged. The discovery forward runs without gradients in eval
mode; training flags are restored.
"""

from __future__ import annotations

from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.sites import OpKind
from qinsight.frontends.base import ModuleView, module_view
from qinsight.frontends.modules import quantizable_modules
from qinsight.frontends.op_sites import Discovery, layer_sites, op_sites


def eager_view(
    model: nn.Module, example: object, qconfig_mapping: QConfigMapping | None = None, backend: str = "x86"
) -> ModuleView:
    """The view of ``model``, with its sites and the ops around them found by calling it on ``example``
    (one batch, :class:`~qinsight.frontends.op_sites.Discovery`)."""
    candidates = quantizable_modules(model)
    discovery = Discovery(model, tuple(candidates)).run(example)
    sites = layer_sites(discovery, candidates, qconfig_mapping)
    ops = op_sites(discovery, qconfig_mapping, backend)
    # its models are quantized through PT2E, which folds every batch norm into the conv before it
    return module_view("eager", model, sites, tuple(op for op in ops if op.kind is not OpKind.BATCH_NORM))
