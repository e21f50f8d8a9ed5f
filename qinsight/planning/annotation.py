"""A PT2E quantizer asked again for each config a plan simulates: the pattern graphs it exports, exported once.

XNNPACKQuantizer's ``annotate`` exports its conv-batch-norm patterns with ``torch.export`` on every
call (torchao's ``_get_aten_graph_module_for_pattern``, twelve exports): on MobileNetV2 that is all
of its 2.3 s a call, and 4 MB torch never gives back. A plan asks the quantizer which edges each
config quantizes (hundreds of configs), so within :meth:`ExportedPatterns.installed` the helper answers
a pattern it has exported before with a copy of that graph (its callers rewrite the graph they get).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

_HELPER = "_get_aten_graph_module_for_pattern"
_LOG = logging.getLogger(__name__)


def _key(pattern: Any, example_inputs: tuple[Any, ...], is_cuda: bool, kwargs: dict[str, Any]) -> object | None:
    """What a pattern's export depends on: its function's code and closure (the conv it calls, whether a
    ReLU follows), the inputs' shapes and dtypes, the device; ``None`` where any of it is unhashable."""
    function = getattr(pattern, "fn", pattern)  # torchao's WrapperModule holds the pattern function
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    try:
        cells = tuple(cell.cell_contents for cell in function.__closure__ or ())
        shapes = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in example_inputs)
        key = (code, cells, bool(is_cuda), shapes, tuple(sorted(kwargs.items())))
        hash(key)
    except (TypeError, ValueError):  # an unhashable input, an empty cell
        return None
    return key


class ExportedPatterns:
    """The pattern graphs one plan's quantizer exports, each exported once: the cache's one owner is the
    run that makes it (a :class:`~qinsight.planning.simulated_flows.Pt2eFlow`'s simulation), its bound
    ``bound`` graphs (a quantizer has a few dozen patterns; past the bound a pattern is exported again,
    not kept). It is let go with the run."""

    def __init__(self, bound: int = 256) -> None:
        self._graphs: dict[object, Any] = {}
        self._bound = bound

    def __len__(self) -> int:
        return len(self._graphs)

    def _cached(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def exported(pattern: Any, example_inputs: tuple[Any, ...], is_cuda: bool = False, **kwargs: Any) -> Any:
            key = _key(pattern, example_inputs, is_cuda, kwargs)
            if key is None:
                return original(pattern, example_inputs, is_cuda, **kwargs)
            if key not in self._graphs:
                graph = original(pattern, example_inputs, is_cuda, **kwargs)
                if len(self._graphs) >= self._bound:
                    return graph
                self._graphs[key] = graph
            return copy.deepcopy(self._graphs[key])  # its callers rewrite the graph they get

        return exported

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Within it, every loaded module's reference to torchao's pattern-export helper answers from this
        cache; outside, the helper is torchao's again. Where torchao has no such helper (another version),
        nothing changes, and a debug line says so."""
        helpers = sys.modules.get("torchao.quantization.pt2e.utils")
        original = getattr(helpers, _HELPER, None)
        if original is None:
            _LOG.debug("torchao has no %s: each config's annotation exports its patterns again", _HELPER)
            yield
            return
        holders = [
            module for module in list(sys.modules.values()) if getattr(module, "__dict__", {}).get(_HELPER) is original
        ]
        replacement = self._cached(original)
        for module in holders:
            setattr(module, _HELPER, replacement)
        try:
            yield
        finally:
            for module in holders:
                setattr(module, _HELPER, original)


__all__ = ["ExportedPatterns"]
