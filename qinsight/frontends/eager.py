"""The eager frontend: any ``nn.Module``, including models FX cannot trace.

Sites are found by running the model once on an example batch with counting
hooks on every Linear/Conv module (a fused module counts as one site, as in
FX). They are ordered by first call, with calls per forward counted. Sites
are observed with the same forward hooks as the FX frontend's, so every
detector that needs only module inputs, outputs and weights (all built-in
ones) works unchanged. The discovery forward runs without gradients in eval
mode; training flags are restored.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.errors import FrontendError
from qinsight.frontends.base import ModuleView, eval_mode, run_batch
from qinsight.frontends.modules import quantizable_modules, site_for_module
from qinsight.frontends.ops import with_ops


def eager_view(
    model: nn.Module, example: object, qconfig_mapping: QConfigMapping | None = None, backend: str = "x86"
) -> ModuleView:
    """The view of ``model``, with sites discovered by calling it on ``example`` (one batch), and the
    ops around them by a second call (:func:`~qinsight.frontends.ops.op_sites`)."""
    candidates = quantizable_modules(model)
    calls: Counter[str] = Counter()
    removers = [
        found.module.register_forward_pre_hook(lambda _m, _a, fqn=fqn: calls.update([fqn])).remove
        for fqn, found in candidates.items()
    ]
    try:
        with eval_mode(model), torch.no_grad():
            run_batch(model, example)
    except Exception as exc:
        raise FrontendError(f"the example batch failed in {type(model).__name__}: {type(exc).__name__}: {exc}") from exc
    finally:
        for remove in removers:
            remove()
    sites = tuple(  # first-call order
        site_for_module(fqn, candidates[fqn].module, candidates[fqn].kind, candidates[fqn].holder, count, qconfig_mapping)
        for fqn, count in calls.items()
    )
    modules = {fqn: candidates[fqn].module for fqn in calls}
    weights = {fqn: candidates[fqn].holder for fqn in calls}
    sites, ops = with_ops(model, sites, example, qconfig_mapping, backend)
    modules.update({op.fqn: model.get_submodule(op.fqn) for op in ops if op.call is None})
    return ModuleView(frontend="eager", model=model, sites=sites, modules=modules, weights=weights, ops=ops)
