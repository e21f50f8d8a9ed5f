"""The flows and backends as registries (qinsight.core.flows, qinsight.core.backend): a backend is one
record, found by its name or by what its quantizer is; nothing else decides by a flow's or a backend's
name; and a backend a flow does not serve is one error naming the flow that does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import qinsight
from qinsight.core import backend as registry
from qinsight.core.backend import Backend, backend_names, backend_of, get_backend, planned_backend
from qinsight.core.entry_points import PluginEntry
from qinsight.core.flows import check_flow_backend, flow_spec, flows_serving, verifying_flows
from qinsight.core.sites import FLOWS

PACKAGE = Path(qinsight.__file__).resolve().parent
REGISTRIES = {"core/flows.py", "apply/torch_flows.py"}  # where a flow's name may be spelled out and compared


def test_the_built_in_backends_are_records_registered_as_a_third_partys_are() -> None:
    installed = {entry.name: entry.target for entry in registry.installed(registry.GROUP)}
    # pyproject.toml's entry points, as the source checkout knows them (CI installs plugins/: an edge backend)
    assert installed.items() >= registry.BUILTIN_BACKENDS.items() and set(backend_names()) == set(installed)
    records = {name: get_backend(name) for name in registry.BUILTIN_BACKENDS}
    assert all(isinstance(record, Backend) and record.name == name for name, record in records.items())
    assert {name: record.flows for name, record in records.items()} == {
        "fbgemm": ("fx",),
        "onednn": ("fx",),
        "qnnpack": ("fx",),
        "x86": ("fx", "pt2e", "torchao"),
        "xnnpack": ("pt2e",),
    }
    assert {name for name, record in records.items() if record.lowering is not None} == {"x86", "xnnpack"}
    assert {name for name, record in records.items() if record.reduced_range} == {"x86", "fbgemm"}
    assert records["xnnpack"].fx_config_engine == "qnnpack" and records["onednn"].fx_config_engine == "onednn"


def test_a_quantizer_says_its_backend_by_what_it_is_the_most_derived_class_winning() -> None:
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from torchao.quantization.pt2e.quantizer import ComposableQuantizer

    from qinsight.backends.x86 import default_x86_quantizer
    from qinsight.backends.xnnpack import default_xnnpack_quantizer

    class Renamed(XNNPACKQuantizer):  # type: ignore[misc]
        pass  # registered as no backend: still XNNPACK's

    found = {
        name: None if (record := backend_of(quantizer)) is None else record.name
        for name, quantizer in {
            "x86": default_x86_quantizer(),
            "xnnpack": default_xnnpack_quantizer(),
            "renamed": Renamed(),
            "composed": ComposableQuantizer([default_xnnpack_quantizer(), Renamed()]),
            "both": ComposableQuantizer([default_xnnpack_quantizer(), default_x86_quantizer()]),
            "none": object(),
        }.items()
    }
    assert found == {
        "x86": "x86",
        "xnnpack": "xnnpack",
        "renamed": "xnnpack",
        "composed": "xnnpack",
        "both": None,
        "none": None,
    }
    assert planned_backend("plan", None, default_xnnpack_quantizer()) == "xnnpack"
    with pytest.raises(qinsight.errors.InvalidParameterError, match="'xnnpack', the backend your XNNPACKQuantizer"):
        planned_backend("plan", "x86", default_xnnpack_quantizer())


def test_an_unknown_or_broken_backend_is_one_error_naming_what_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "installed", lambda group: ())  # a source checkout: the built-ins alone
    with pytest.raises(qinsight.errors.InvalidParameterError) as raised:
        get_backend("tpu", "diagnose")
    assert str(raised.value) == (
        "diagnose: backend='tpu' is invalid; expected one of fbgemm, onednn, qnnpack, x86, xnnpack"
    )
    broken = PluginEntry(
        group=registry.GROUP, name="broken", distribution="acme", version="1", target="qinsight.core.sites:FLOWS"
    )
    monkeypatch.setattr(registry, "installed", lambda group: (broken,))
    with pytest.raises(qinsight.errors.PluginLoadError, match="gives tuple, not the Backend 'broken'"):
        get_backend("broken")
    assert flows_serving("x86") == ("fx", "pt2e", "torchao")  # the others still load


def test_xnnpack_is_served_by_pt2e_alone_and_pt2e_stands_in_x86_for_fxs_other_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "installed", lambda group: ())  # the built-ins alone, as errors list them
    assert flows_serving("xnnpack") == ("pt2e",) and flows_serving("x86") == ("fx", "pt2e", "torchao")
    assert flows_serving("x86", lowered=True) == flows_serving("xnnpack", lowered=True) == ("pt2e",)
    assert flows_serving("onednn", lowered=True) == ()
    # verified unless told: the model's own flow; without FX's trace, every flow that takes it
    assert verifying_flows("fx", "x86") == ("fx",) and verifying_flows("export", "x86") == ("pt2e",)
    assert verifying_flows("eager", "x86") == ("pt2e", "torchao") and verifying_flows("eager", "xnnpack") == ("pt2e",)
    assert flow_spec("pt2e").backend_for("plan", "fbgemm") == "x86"
    with pytest.raises(qinsight.errors.InvalidParameterError) as raised:
        flow_spec("fx").backend_for("qconfig_mapping", "xnnpack")
    assert str(raised.value) == (
        "qconfig_mapping: backend='xnnpack' is invalid; expected one of fbgemm, onednn, qnnpack, x86 for flow='fx' "
        "(xnnpack is served by flow='pt2e')"
    )
    with pytest.raises(qinsight.errors.InvalidParameterError, match="expected one of x86, xnnpack for flow='pt2e'"):
        check_flow_backend("plan", "pt2e", "onednn")


def _comparisons_with(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines comparing something with one of ``names`` (``flow == "fx"``, ``"x86" != backend``,
    ``in ("x86", "fbgemm")``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [o.value for o in operands if isinstance(o, ast.Constant)]
            values += [
                e.value
                for o in operands
                if isinstance(o, (ast.Tuple, ast.List, ast.Set))
                for e in o.elts
                if isinstance(e, ast.Constant)
            ]
            if any(value in names for value in values):
                found.append(node.lineno)
    return found


def test_no_module_decides_by_a_backends_name() -> None:
    """A backend's facts are asked of its record: a third party's backend is then as able as x86."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if lines := _comparisons_with(ast.parse(path.read_text()), set(backend_names())):
            offenders[path.relative_to(PACKAGE).as_posix()] = lines
    assert offenders == {}


def test_no_module_outside_the_registries_decides_by_a_flows_name() -> None:
    """A flow's facts are asked of its FlowSpec; comparing the names would make adding a flow a hunt.
    (The frontend ``"fx"`` is a frontend's name, compared in frontends/select.py: not a flow.)"""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in REGISTRIES or relative == "frontends/select.py":
            continue
        lines = _comparisons_with(ast.parse(path.read_text()), set(FLOWS))
        if lines:
            offenders[relative] = lines
    assert offenders == {}
