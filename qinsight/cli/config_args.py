"""What the command line names: the user's functions (``package.module:function``), and the config and
flow a command quantizes with (``--qconfig``, ``--flow``, ``--backend``, ``--lowered``), each asked of the
flow registry (:mod:`qinsight.core.flows`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from qinsight.core.backend import backend_names, check_backend, is_quantizer, planned_backend
from qinsight.core.errors import UsageError
from qinsight.core.flows import flow_spec, flows_serving
from qinsight.core.sites import FlowName, checked_flow

if TYPE_CHECKING:
    from torch.ao.quantization import QConfigMapping


def load_factory(target: str, what: str) -> Callable[[], object]:
    """The function ``package.module:function``, found in the current folder too (like ``python -m``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{what} must look like package.module:factory, not {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load {what} {target}: {type(exc).__name__}: {exc}") from exc
    if not callable(factory):
        raise UsageError(f"{what} {target} is not callable")
    return factory  # type: ignore[no-any-return]


def planned_config(args: argparse.Namespace) -> tuple[QConfigMapping | None, object | None]:
    """``--qconfig`` as diagnose's ``qconfig_mapping=`` or ``quantizer=``: the backend's default config
    (its first flow's: FX's mapping, XNNPACK's quantizer), none, or what a function returns (whose
    quantizer, without ``--backend``, says the backend)."""
    from torch.ao.quantization import QConfigMapping

    from qinsight.apply.recipe import default_config

    backend = planned_backend("diagnose", args.backend, None)  # diagnose's own default where none is given
    if args.qconfig == "none":
        return None, None
    if args.qconfig == "default":
        config, _name = default_config(flows_serving(backend)[0], backend, "diagnose")
    else:
        config = load_factory(args.qconfig, "--qconfig")()
    if isinstance(config, QConfigMapping):
        return config, None
    if is_quantizer(config):  # a torchao Quantizer, composed or not
        return None, config
    raise UsageError(f"--qconfig gave {type(config).__name__}, not a torch QConfigMapping or a PT2E Quantizer")


def compared_flow(args: argparse.Namespace) -> FlowName:
    """``--flow``, or the first flow serving ``--backend`` that lowers where ``--lowered`` asks (PT2E)."""
    if args.flow is not None:
        flow = checked_flow(args.flow, "compare")
        if args.lowered and not flow_spec(flow).lowers:
            raise UsageError(
                f"--flow {flow} cannot be compared with --lowered: --lowered lowers a PT2E model; use --flow pt2e"
            )
        return flow
    served = flows_serving(check_backend("compare", args.backend), lowered=args.lowered)
    if not served:
        lowered = [name for name in backend_names() if flows_serving(name, lowered=args.lowered)]
        raise UsageError(
            f"--backend {args.backend}: {'--lowered takes' if args.lowered else 'one of'} {', '.join(lowered)}"
        )
    return served[0]


__all__ = ["compared_flow", "load_factory", "planned_config"]
