"""Frontends: the only code that knows how a kind of model is represented.

A frontend turns a model into a :class:`~qinsight.frontends.base.ModelView`:
its op sites, their weights, and a way to attach observers. Detectors see
only the view.
"""

from qinsight.frontends.base import ModelView, ModuleView
from qinsight.frontends.eager import eager_view
from qinsight.frontends.exported import ExportedView, exported_view
from qinsight.frontends.fx import fx_view

__all__ = ["ExportedView", "ModelView", "ModuleView", "eager_view", "exported_view", "fx_view"]
