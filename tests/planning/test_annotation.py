"""A PT2E quantizer asked again for each config a plan simulates exports its patterns once."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _models import ConvBnReluCNN
from torch import fx

from qinsight.planning.annotation import ExportedPatterns


def _annotations(quantizer: Any, graph: fx.GraphModule) -> dict[str, tuple[object, ...]]:
    """``quantizer``'s annotation of ``graph``, made afresh: each node's input specs and output spec."""
    for node in graph.graph.nodes:
        node.meta.pop("quantization_annotation", None)
    quantizer.annotate(graph)
    found: dict[str, tuple[object, ...]] = {}
    for node in graph.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        if annotation is not None:
            inputs = sorted((source.name, repr(spec)) for source, spec in annotation.input_qspec_map.items())
            found[node.name] = (tuple(inputs), repr(annotation.output_qspec))
    return found


@pytest.mark.parametrize(
    "training", [False, pytest.param(True, marks=pytest.mark.slow)]
)  # batch norms folded, and not: the conv-bn patterns match; the unfolded one in the whole suite's tier
def test_a_quantizer_asked_again_annotates_the_same_and_exports_no_pattern_twice(
    training: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    model = ConvBnReluCNN().train(training)
    graph = torch.export.export(model, (torch.randn(2, 3, 8, 8),)).module()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    plain = _annotations(quantizer, graph)
    patterns = ExportedPatterns()  # one run's
    with patterns.installed():
        first = _annotations(quantizer, graph)
    exports: list[object] = []
    export = torch.export.export

    def counted(*args: Any, **kwargs: Any) -> Any:
        exports.append(args[0])
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    with patterns.installed():
        again = _annotations(quantizer, graph)
    assert len(plain) >= 4 and plain == first == again
    assert exports == []  # every pattern came from the first call's exports
    _annotations(quantizer, graph)
    assert exports  # outside, torchao's helper exports again
    exports.clear()
    with ExportedPatterns().installed():  # another run's cache: nothing shared with the first's
        _annotations(quantizer, graph)
    assert len(exports) == len(patterns) > 0
    exports.clear()
    with (bounded := ExportedPatterns(bound=2)).installed():  # past its bound a pattern is exported again, not kept
        _annotations(quantizer, graph)
        _annotations(quantizer, graph)
    assert len(bounded) == 2 and len(exports) == 2 * len(patterns) - 2


def test_without_torchaos_helper_nothing_changes_and_a_debug_line_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torchao.quantization.pt2e.utils", types.ModuleType("utils"))
    with caplog.at_level("DEBUG", logger="qinsight.planning.annotation"), ExportedPatterns().installed():
        pass
    assert "torchao has no _get_aten_graph_module_for_pattern" in caplog.text
