"""The package's layers, as docs/architecture.md draws them, checked on the source.

Each subpackage is a layer; a module may import from its own layer and the ones
below it, never from a layer above (not even inside a function), and the imports form no loop.
The core and the plugin contract load no torch, numpy, cattrs or matplotlib.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "qinsight"

# Lowest first: what a layer may import is itself and everything before it.
LAYERS = (
    "core",
    "plugin",
    "observe",
    "distributed",
    "frontends",
    "detectors",
    "compare",
    "apply",
    "backends",
    "pipeline",
    "outputs",
    "planning",
    "examples",
    "cli",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


# What users import, not the layers: the top level's stub-backed names, its records and its errors.
FACADES = ("types", "errors")


def layer(module: str) -> int | None:
    """The layer index of a qinsight module; None for the facades and _version/__main__."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("_version", "__main__", *FACADES):
        return None
    return LAYERS.index(parts[1])


def imports(path: Path, known: dict[str, Path]) -> Iterator[tuple[str, list[str], bool]]:
    """(imported qinsight module, names taken from it, whether the import runs at module load)."""
    tree = ast.parse(path.read_text())
    deferred = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
    }
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qinsight"):
            names = [alias.name for alias in node.names]
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in known]
            for target in submodules or [node.module]:
                yield target, names, id(node) not in deferred
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("qinsight"):
                    yield alias.name, [], id(node) not in deferred


def edges() -> list[tuple[str, str, list[str], bool]]:
    known = modules()
    return [
        (source, target, names, eager)
        for source, path in known.items()
        for target, names, eager in imports(path, known)
    ]


def test_every_module_is_in_a_layer() -> None:
    for module in modules():
        assert (
            module == "qinsight"
            or layer(module) is not None
            or module.split(".")[1] in ("_version", "__main__", *FACADES)
        ), module


def test_no_layer_imports_a_facade() -> None:
    """The facades are for users; inside the package each name comes from its layer."""
    through = [
        (source, target)
        for source, target, _names, _eager in edges()
        if target.split(".")[1:2] in (["types"], ["errors"])
    ]
    assert through == []


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [
        (source, target)
        for source, target, _names, _eager in edges()
        if (low := layer(source)) is not None and (high := layer(target)) is not None and high > low
    ]
    assert upward == []


def find_loop(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of ``graph`` as the modules along it, or [] if it has none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            if loop := visit(nxt, path + [node]):
                return loop
        done.add(node)
        return []

    for node in sorted(graph):
        if loop := visit(node, []):
            return loop
    return []


def import_graph(*, deferred: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for source, target, _names, eager in edges():
        if source != target and (eager or deferred):
            graph.setdefault(source, set()).add(target)
    return graph


def test_find_loop_finds_loops() -> None:
    assert find_loop({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_loop({"a": {"b", "c"}, "b": {"c"}}) == []


def test_imports_form_no_loop() -> None:
    # module-level imports, and also the ones inside functions
    assert find_loop(import_graph(deferred=False)) == []
    assert find_loop(import_graph(deferred=True)) == []


def test_no_module_imports_a_private_name_of_another() -> None:
    private = [
        (source, target, name)
        for source, target, names, _eager in edges()
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != source
    ]
    assert private == []


def test_no_module_is_long() -> None:
    """Past 400 lines a module is worth a look (a warning: a length is no target); past 500 it holds two concepts."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    if long := {name: n for name, n in lengths.items() if n > 400}:
        warnings.warn(f"modules over 400 lines, worth splitting: {long}", stacklevel=1)
    assert {name: n for name, n in lengths.items() if n > 500} == {}


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, its docstring aside."""
    first = function.body[0]
    documented = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    start = (first.end_lineno or first.lineno) + 1 if documented and len(function.body) > 1 else function.lineno
    return (function.end_lineno or function.lineno) - start + 1


def test_no_function_is_long() -> None:
    """Past 60 lines (its docstring aside) a function does two things: each is a function of its own."""
    long = {
        f"{name}.{node.name}": _body_lines(node)
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _body_lines(node) > 60
    }
    assert long == {}


def test_no_two_modules_share_a_name() -> None:
    """A module's name says its role: two ``flows.py`` make a reader ask which (the top-level facades,
    ``qinsight/errors.py`` over ``core/errors.py``, are the one exception)."""
    names: dict[str, list[str]] = {}
    for name, path in modules().items():
        parts = name.split(".")
        if path.name != "__init__.py" and (len(parts) > 2 or parts[-1] not in FACADES):
            names.setdefault(parts[-1], []).append(name)
    assert {base: found for base, found in names.items() if len(found) > 1} == {}


# Names that hold the words qinsight shows (a note, a check's change, a reason, a suggestion described):
# code acts on kinds and fields, never on these words, so rewording a message changes no behaviour.
SHOWN = {"change", "reason", "text", "note", "notes", "said", "error", "message"}


def _shown(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute | ast.Name):
        return (node.attr if isinstance(node, ast.Attribute) else node.id) in SHOWN
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "describe"


def test_no_code_acts_on_the_words_it_shows() -> None:
    """No comparison of shown words with a literal (``"smoothed model" in note``, ``check.change ==
    "equalize"``, ``s.describe() == "keep in float"``): the kinds and fields say it."""
    found = [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(_shown(o) for o in (node.left, *node.comparators))
        and any(isinstance(o, ast.Constant) and isinstance(o.value, str) for o in (node.left, *node.comparators))
    ]
    assert found == []


@functools.cache
def _called() -> dict[str, set[str]]:
    """Each function name the package calls (``name(...)`` or ``x.name(...)``) and the modules that call it."""
    found: dict[str, set[str]] = {}
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                found.setdefault(name, set()).add(module)
    return found


def _calls(name: str) -> set[str]:
    """The modules whose code calls a function called ``name``."""
    return _called().get(name, set())


def test_one_trial_quantizes_a_config_for_real() -> None:
    """torch's convert is called by the flow registry alone; the recipe ``qinsight.quantize`` follows is
    called by it, by the one trial, which verification and plans score every config through, and by the
    bias correction, which reads the weights and outputs of the config it corrects from its converted model."""
    assert _calls("convert_fx") | _calls("convert_pt2e") == {"qinsight.apply.torch_flows"}
    assert _calls("quantize_with") == {"qinsight.apply", "qinsight.apply.trial", "qinsight.apply.bias_correction"}
    assert _calls("run_trial") == {"qinsight.pipeline.verifier", "qinsight.planning.simulated_flows"}


HEAVY = ("torch", "numpy", "cattrs", "matplotlib")


@pytest.mark.parametrize(
    "statement",
    [
        "import qinsight",
        "import qinsight.core.report, qinsight.core.comparison, qinsight.core.stats, qinsight.core.errors",
        "import qinsight.core.advice, qinsight.core.metrics, qinsight.core.progress, qinsight.core.equalization",
        "from qinsight import Advice, advice_of; from qinsight.types import MetricSpec, Progress, FlowName",
        "import qinsight.types, qinsight.errors",
        "import qinsight.plugin",
        "from qinsight import Report, Comparison, EqualizationMapping, QinsightError; from qinsight.errors import "
        "NotFoundError",
    ],
)
def test_the_core_loads_nothing_heavy(statement: str) -> None:
    probe = (
        f"import sys; {statement}; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_lazy_names_resolve_to_their_homes() -> None:
    probe = (
        "import qinsight, sys; assert 'qinsight.pipeline' not in sys.modules; "
        "assert qinsight.diagnose.__module__ == 'qinsight.pipeline.session'; "
        "missing = [n for n in qinsight.__all__ if getattr(qinsight, n, None) is None]; "
        "assert set(qinsight.__all__) <= set(dir(qinsight)); print(missing)"
    )
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
    import qinsight

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qinsight.nope  # noqa: B018


def test_instrument_is_the_function_and_the_instrumenter_is_reachable() -> None:
    import qinsight
    from qinsight.observe.instrumenter import Instrumenter

    assert callable(qinsight.instrument) and not isinstance(qinsight.instrument, type(sys))
    assert Instrumenter.__module__ == "qinsight.observe.instrumenter"


def test_the_public_names_are_one_list_a_user_can_hold_in_mind() -> None:
    """The stub type checkers see (``__init__.pyi``) is the one list: ``__all__`` and the lazy lookups are
    its names, each the object of the module the stub names; it holds at most 40."""
    import qinsight

    tree = ast.parse((PACKAGE / "__init__.pyi").read_text())
    stub = {
        (node.module, alias.asname or alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert sorted(qinsight.__all__) == sorted(name for _home, name in stub)
    assert len(qinsight.__all__) <= 40
    for home, name in sorted(stub):
        assert getattr(qinsight, name) is getattr(__import__(home, fromlist=[name]), name), name


def test_every_top_level_function_names_each_argument_and_what_it_returns() -> None:
    """A reader of ``help(qinsight.plan)`` finds each argument under ``Args:`` and the result under
    ``Returns:`` (where there is one)."""
    import inspect

    import qinsight

    unsaid = {}
    for name in qinsight.__all__:
        function = getattr(qinsight, name)
        if not inspect.isfunction(function):
            continue
        doc = inspect.getdoc(function) or ""
        args = doc.partition("Args:")[2].partition("Returns:")[0]
        missing = [p for p in inspect.signature(function).parameters if not re.search(rf"\b{p}\b", args)]
        returns = inspect.signature(function).return_annotation not in (None, "None")
        if ("Returns:" in doc) != returns or missing:
            unsaid[name] = missing
    assert unsaid == {}


def _resolves(target: str) -> bool:
    """Whether ``qinsight.a.b.C.d`` names a module and the attributes below it."""
    import importlib

    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_cross_reference_in_a_docstring_names_what_is_there() -> None:
    """``:func:`qinsight.core.sites.checked_flow``` and the like: a renamed or moved name leaves none stale."""
    pattern = re.compile(r":(?:func|class|meth|mod|data|attr):`~?(qinsight(?:\.\w+)+)`")
    stale = [
        f"{name}: {target}"
        for name, path in modules().items()
        for target in pattern.findall(path.read_text())
        if not _resolves(target)
    ]
    assert stale == []


def test_the_names_the_top_level_gave_up_still_resolve_with_a_warning_naming_their_place() -> None:
    import qinsight

    for module, names in qinsight._MOVED.items():
        home = __import__(module, fromlist=["_"])
        assert set(names) <= set(getattr(home, "__all__", dir(home))), module
        for name in names:
            with pytest.warns(DeprecationWarning, match=rf"qinsight\.{name} is now {module}\.{name};"):
                value = getattr(qinsight, name)
            assert value is getattr(home, name)
    assert not set(qinsight._MOVED_TO) & set(qinsight.__all__)
    with pytest.warns(DeprecationWarning, match="qinsight.errors.InvalidParameterError"):
        from qinsight import InvalidParameterError  # noqa: F401


def test_a_mapping_from_a_report_file_loads_neither_the_observers_nor_the_pipeline(tmp_path: Path) -> None:
    probe = (
        "import sys, qinsight, torch; from torch import nn; "
        "model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval(); "
        "report = qinsight.diagnose(model, [torch.randn(2, 4) for _ in range(2)]); "
        f"qinsight.save_report(report, {str(tmp_path / 'r.json')!r})"
    )
    subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    build = (
        "import sys, qinsight; "
        f"mapping = qinsight.qconfig_mapping(qinsight.load_report({str(tmp_path / 'r.json')!r})); "
        "print(type(mapping).__name__, "
        "','.join(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith('qinsight.')})))"
    )
    kind, loaded = subprocess.run(
        [sys.executable, "-c", build], capture_output=True, text=True, check=True
    ).stdout.split()
    assert kind == "QConfigMapping"
    layers = set(loaded.split(","))
    # reading the file finds each finding's class with its detector (plugin, detectors); the mapping names
    # functional calls as the frontends resolve them; the report's backend is its record (FX's engine)
    allowed = {"core", "plugin", "detectors", "frontends", "apply", "backends", "outputs", "_version"}
    assert layers <= {f"qinsight.{layer}" for layer in allowed}, layers
    assert "qinsight.apply" in layers and not layers & {"qinsight.observe", "qinsight.pipeline", "qinsight.planning"}


TESTS = Path(__file__).resolve().parent


def test_no_test_imports_another_test_module_or_a_private_name() -> None:
    """Tests share what they share through the helper modules (``_models``, ``_data``, ``_cli``...), not through
    each other, and use qinsight as its users can: no private name imported."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [alias.name for alias in node.names]
                if node.module.split(".")[-1].startswith("test_"):
                    wrong.append((path.name, node.module))
                if node.module.startswith("qinsight"):
                    wrong += [(path.name, f"{node.module}.{n}") for n in names if n.startswith("_")]
            elif isinstance(node, ast.Import):
                wrong += [
                    (path.name, alias.name) for alias in node.names if alias.name.split(".")[-1].startswith("test_")
                ]
    assert wrong == []


def test_the_tests_are_laid_out_by_layer() -> None:
    folders = {path.parent.name for path in TESTS.rglob("test_*.py") if path.parent != TESTS}
    assert folders <= {*LAYERS, "models"}, folders - {*LAYERS, "models"}
    assert [path.name for path in TESTS.glob("test_*.py")] == ["test_architecture.py"]
