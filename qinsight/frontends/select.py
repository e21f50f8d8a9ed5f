"""Frontend selection: which frontend reads a given model."""

from __future__ import annotations

from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.errors import FrontendError
from qinsight.core.sites import Frontend, checked_frontend
from qinsight.frontends.eager import eager_view
from qinsight.frontends.exported import exported_sites, exported_view
from qinsight.frontends.fx import fx_view
from qinsight.plugin.detector import ModelView


def view_of(
    model: nn.Module, frontend: Frontend, mapping: QConfigMapping | None, example: object | None, backend: str = "x86"
) -> ModelView:
    """The exported view for an exported graph, the FX view if the model traces, else the eager view."""
    checked_frontend(frontend, "diagnose")
    if frontend == "export" or (frontend == "auto" and exported_sites(model)):
        return exported_view(model, mapping)
    if frontend != "eager":
        try:
            return fx_view(model, mapping, example, backend)
        except FrontendError as exc:
            if frontend == "fx" or example is None:
                hint = "" if frontend == "fx" else "; or give an example batch (example_inputs=) for the eager frontend"
                raise FrontendError(f"{exc}{hint}") from exc.__cause__
    if example is None:
        raise FrontendError("the eager frontend finds a model's sites by running it: pass example_inputs=")
    return eager_view(model, example, mapping, backend)
