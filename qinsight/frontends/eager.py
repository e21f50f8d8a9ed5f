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

from qinsight.errors import FrontendError
from qinsight.frontends.base import ModuleView, eval_mode, run_batch
from qinsight.frontends.fx import classify, site_for_module
from qinsight.sites import OpKind


def _candidates(model: nn.Module) -> dict[str, tuple[nn.Module, OpKind, nn.Module]]:
    """(module, kind, weight holder) of each Linear/Conv by name, not descending into one
    (the Linear inside a LinearReLU is not a site of its own)."""
    found: dict[str, tuple[nn.Module, OpKind, nn.Module]] = {}
    for fqn, module in model.named_modules():
        classified = classify(module)
        if fqn and classified is not None and not any(fqn.startswith(f"{known}.") for known in found):
            found[fqn] = (module, *classified)
    return found


def eager_view(model: nn.Module, example: object, qconfig_mapping: QConfigMapping | None = None) -> ModuleView:
    """The view of ``model``, with sites discovered by calling it on ``example`` (one batch)."""
    candidates = _candidates(model)
    calls: Counter[str] = Counter()
    removers = [
        module.register_forward_pre_hook(lambda _m, _a, fqn=fqn: calls.update([fqn])).remove
        for fqn, (module, _, _) in candidates.items()
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
        site_for_module(fqn, *candidates[fqn], count, qconfig_mapping) for fqn, count in calls.items()
    )
    modules = {fqn: candidates[fqn][0] for fqn in calls}
    weights = {fqn: candidates[fqn][2] for fqn in calls}
    return ModuleView(frontend="eager", model=model, sites=sites, modules=modules, weights=weights)
