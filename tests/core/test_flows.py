"""The flows as one registry (qinsight.core.flows): every layer's table has an entry for every flow and
backend, nothing else decides by a flow's name, and a backend a flow does not serve is one error naming
the flow that does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import qinsight
from qinsight.apply.pt2e import BACKEND_QUANTIZERS, DEFAULT_QUANTIZERS, QUANTIZER_BACKENDS
from qinsight.apply.recipe import CONFIG_BUILDERS, DEFAULT_CONFIGS
from qinsight.compare.flows import QUANT_FLOWS
from qinsight.compare.lowering import LOWERINGS
from qinsight.core.flows import FLOW_SPECS, check_flow_backend, flow_spec, flows_serving, verifying_flows
from qinsight.core.sites import BACKENDS, FLOWS
from qinsight.planning.flows import FLOW_CLASSES

PACKAGE = Path(qinsight.__file__).resolve().parent
REGISTRIES = {"core/flows.py", "compare/flows.py"}  # where a flow's name may be spelled out and compared


def test_every_flow_has_its_config_builder_prepare_convert_and_simulation() -> None:
    for table in (FLOW_SPECS, QUANT_FLOWS, CONFIG_BUILDERS, DEFAULT_CONFIGS):
        assert set(table) == set(FLOWS), table
    assert all(QUANT_FLOWS[name].name == name for name in FLOWS)
    # qinsight.plan searches the float sites of every flow but those plan_formats plans (a format per Linear)
    assert set(FLOW_CLASSES) == {name for name in FLOWS if not FLOW_SPECS[name].plans_formats} == {"fx", "pt2e"}
    assert all(FLOW_CLASSES[name].name == name for name in FLOW_CLASSES)


def test_every_backend_is_served_and_every_pt2e_backend_has_its_quantizers_and_a_lowering() -> None:
    assert {backend for spec in FLOW_SPECS.values() for backend in spec.backends} == set(BACKENDS)
    lowering = [spec for spec in FLOW_SPECS.values() if spec.lowers]
    assert [spec.name for spec in lowering] == ["pt2e"]
    assert set(BACKEND_QUANTIZERS) == set(DEFAULT_QUANTIZERS) == set(lowering[0].backends) == set(LOWERINGS)
    assert set(QUANTIZER_BACKENDS.values()) == set(BACKEND_QUANTIZERS)


def test_xnnpack_is_served_by_pt2e_alone_and_pt2e_stands_in_x86_for_fxs_other_engines() -> None:
    assert flows_serving("xnnpack") == ("pt2e",) and flows_serving("x86") == ("fx", "pt2e", "torchao")
    # verified unless told: the model's own flow; without FX's trace, every flow that takes it
    assert verifying_flows("fx", "x86") == ("fx",) and verifying_flows("export", "x86") == ("pt2e",)
    assert verifying_flows("eager", "x86") == ("pt2e", "torchao") and verifying_flows("eager", "xnnpack") == ("pt2e",)
    assert flow_spec("pt2e").backend_for("plan", "fbgemm") == "x86"
    with pytest.raises(qinsight.errors.InvalidParameterError) as raised:
        flow_spec("fx").backend_for("qconfig_mapping", "xnnpack")
    assert str(raised.value) == (
        "qconfig_mapping: backend='xnnpack' is invalid; expected one of x86, fbgemm, qnnpack, onednn for flow='fx' "
        "(xnnpack is served by flow='pt2e')"
    )
    with pytest.raises(qinsight.errors.InvalidParameterError, match="expected one of x86, xnnpack for flow='pt2e'"):
        check_flow_backend("plan", "pt2e", "onednn")


def _flow_name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something with a flow's name (``flow == "fx"``, ``"pt2e" != name``, ``in ("fx", ...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [o.value for o in operands if isinstance(o, ast.Constant)]
            names += [
                e.value
                for o in operands
                if isinstance(o, (ast.Tuple, ast.List, ast.Set))
                for e in o.elts
                if isinstance(e, ast.Constant)
            ]
            if any(name in FLOWS for name in names):
                found.append(node.lineno)
    return found


def test_no_module_outside_the_registries_decides_by_a_flows_name() -> None:
    """A flow's facts are asked of its FlowSpec; comparing the names would make adding a flow a hunt.
    (The frontend ``"fx"`` is a frontend's name, compared in frontends/select.py: not a flow.)"""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in REGISTRIES or relative == "frontends/select.py":
            continue
        lines = _flow_name_comparisons(ast.parse(path.read_text()))
        if lines:
            offenders[relative] = lines
    assert offenders == {}
