"""What a PT2E quantizer the user plans to apply will do with each site: ``diagnose(..., quantizer=q)``.

FX's counterpart is ``qconfig_mapping=``, resolved per site by the frontends. A quantizer decides in
its ``annotate`` pass, on the exported graph, so it is asked there: the model is exported with the
first batch and prepared with ``q`` (no calibration, the user's model untouched), and the prepared
graph's view (:mod:`.exported`) says, per Linear/Conv, which weight observer ``q`` put on it
(per-channel or per-tensor; none: ``q`` leaves the layer in float) and, per op around the layers,
whether an observer touches it. Any quantizer works, a ``ComposableQuantizer`` of several too.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from qinsight.core.backend import is_quantizer
from qinsight.core.errors import FrontendError, MissingExtraError
from qinsight.core.sites import OpSite
from qinsight.frontends.base import ModelViewBase, hookless_copy
from qinsight.frontends.exported import exported_view, separate_shared_calls
from qinsight.plugin.detector import ModelView


def _prepared(model: torch.nn.Module, quantizer: object, example: tuple[Any, ...]) -> torch.fx.GraphModule:
    try:
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    except ImportError as exc:
        raise MissingExtraError(f"quantizer= needs torchao: pip install 'qinsight[pt2e]' ({exc})") from exc
    try:
        exported = torch.export.export(hookless_copy(model).eval(), example).module()
        prepared: torch.fx.GraphModule = prepare_pt2e(separate_shared_calls(exported), quantizer)
    except Exception as exc:  # export and the quantizer's own errors have no common base
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise FrontendError(
            f"the quantizer {type(quantizer).__name__} cannot prepare {type(model).__name__}: "
            f"{type(exc).__name__}: {said}"
        ) from exc
    return prepared


def configure_by_quantizer(view: ModelView, quantizer: object, example: tuple[Any, ...]) -> None:
    """``view``'s sites as ``quantizer`` will quantize them: each layer's ``weight_scheme`` (``None``
    and not ``quantized``: left in float), each op's ``quantized``. A site the quantizer's graph does
    not name keeps its own."""
    if not isinstance(view, ModelViewBase):  # every frontend's view is; a plugin's own may not be
        raise FrontendError(f"the {view.frontend} frontend's view cannot be configured by a quantizer")
    if not is_quantizer(quantizer):
        raise FrontendError(
            f"quantizer={type(quantizer).__name__} is not a torchao PT2E Quantizer (it has no annotate)"
        )
    planned = exported_view(_prepared(view.model, quantizer, example))
    layers = {site.fqn: site.weight_scheme for site in planned.sites}
    ops = {op.fqn: op.quantized for op in planned.ops}

    def layer(site: OpSite) -> OpSite:
        if site.fqn not in layers:
            return site
        return attrs.evolve(site, weight_scheme=layers[site.fqn], quantized=layers[site.fqn] is not None)

    def op(site: OpSite) -> OpSite:
        return attrs.evolve(site, quantized=ops[site.fqn]) if site.fqn in ops else site

    view.reconfigure(tuple(map(layer, view.sites)), tuple(map(op, view.ops)))


__all__ = ["configure_by_quantizer"]
