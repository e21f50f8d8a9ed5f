"""A backend is one record: what qinsight knows of a target a model is quantized for, registered once.

A :class:`Backend` says which flows quantize for it (FX through one of torch's engines, PT2E through
its quantizer, torchao's ``quantize_``), how advice becomes its PT2E quantizer, and how its program
is lowered. Every backend, built-in or a third party's (an ExecuTorch delegate qinsight does not ship:
Arm, Qualcomm, Core ML), is an entry point of the group ``qinsight.backends`` whose name is the
``backend=`` a user passes and whose target is the record::

    [project.entry-points."qinsight.backends"]
    edge = "my_package.backend:EDGE"

Names are read from metadata (checking a ``backend=`` imports nothing); a record is imported when a
backend is asked for. A quantizer's backend is found by what it *is* (:func:`backend_of`: an
instance of the classes a record recognizes, seen through composition), never by its class's name.
This module is torch-free: a record's torch side is callables, imported when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import attrs

from qinsight.core.entry_points import PluginEntry, installed, load_entry
from qinsight.core.errors import InvalidParameterError, MissingExtraError, PluginLoadError
from qinsight.core.sites import FlowName, OpSite
from qinsight.core.suggestions import QuantSuggestion

GROUP: Final = "qinsight.backends"
# The built-in records, as pyproject.toml registers them: used where qinsight's own metadata is not
# installed (a source checkout on sys.path). Targets, not imports.
BUILTIN_BACKENDS: Final = {
    "fbgemm": "qinsight.backends.fx_engines:FBGEMM",
    "onednn": "qinsight.backends.fx_engines:ONEDNN",
    "qnnpack": "qinsight.backends.fx_engines:QNNPACK",
    "x86": "qinsight.backends.x86:X86",
    "xnnpack": "qinsight.backends.xnnpack:XNNPACK",
}
DEFAULT_BACKEND: Final = "x86"
PT2E_HINT: Final = "PT2E quantization needs torchao: pip install 'qinsight[pt2e]'"  # every PT2E quantizer's extra


class Program(Protocol):
    """A lowered program: called with a batch's positional tensors, it returns the model's outputs."""

    size_bytes: int

    def __call__(self, *inputs: Any) -> Any: ...


class Lowering(Protocol):
    """How a backend turns a module (any that ``torch.export`` takes) into the program it runs."""

    backend: str

    def runtime(self) -> str:
        """What runs the program, with its version: what a comparison names."""
        ...

    def lower(self, module: Any, example: tuple[Any, ...]) -> Program:
        """``module`` (a copy of it: the module is not changed) lowered for inputs shaped like ``example``."""
        ...


# How advice becomes a backend's PT2E quantizer: the report's (or plan's) sites and suggestions in.
AdviceQuantizer = Callable[[tuple[OpSite, ...], tuple[QuantSuggestion, ...]], Any]


@attrs.frozen(kw_only=True)
class Pt2eQuantizers:
    """A backend's PT2E side: the torchao ``Quantizer`` classes whose instances quantize for it, its
    default quantizer, and the quantizer applying advice. Each is called when needed, so a record
    imports neither torchao nor ExecuTorch; a missing extra raises :class:`MissingExtraError`."""

    types: Callable[[], tuple[type, ...]]
    default: Callable[[], Any]
    default_name: str  # how a comparison names the default ("XNNPACKQuantizer, symmetric per-channel")
    from_advice: AdviceQuantizer


@attrs.frozen(kw_only=True)
class Backend:
    """One backend: its name, the flows that quantize for it, and its torch side."""

    name: str
    title: str
    # torch.ao.quantization's engine FX quantizes for it with (its default QConfigMapping); None: no FX flow
    fx_engine: str | None = None
    # the FX engine whose default config stands for it where only FX's can be read (which ops around
    # the layers are quantized): its own engine, else this one (XNNPACK: qnnpack, its forerunner on phones)
    fx_stand_in: str = "qnnpack"
    # torch's default FX config observes its activations with reduce_range (7 bits): x86, fbgemm
    reduced_range: bool = False
    pt2e: Pt2eQuantizers | None = None
    lowering: Lowering | None = None  # how its program is lowered (PT2E's converted model in); None: not measured
    runs_quantize_: bool = False  # torchao quantize_'s int8 kernels run on it

    @property
    def flows(self) -> tuple[FlowName, ...]:
        """The flows that quantize for it, FX first, torchao last."""
        served: list[FlowName] = []
        if self.fx_engine is not None:
            served.append("fx")
        if self.pt2e is not None:
            served.append("pt2e")
        if self.runs_quantize_:
            served.append("torchao")
        return tuple(served)

    @property
    def fx_config_engine(self) -> str:
        """The FX engine whose default ``QConfigMapping`` stands for this backend's config."""
        return self.fx_engine or self.fx_stand_in


def is_quantizer(config: object) -> bool:
    """Whether ``config`` is a PT2E quantizer: it annotates a graph (torchao's ``Quantizer``, a
    ``ComposableQuantizer`` too, a third party's subclass): the one duck test."""
    return callable(getattr(config, "annotate", None))


def backend_names() -> tuple[str, ...]:
    """The backends installed here, by name, sorted (from metadata: nothing is imported)."""
    return tuple(sorted({entry.name for entry in installed(GROUP)} | set(BUILTIN_BACKENDS)))


def check_backend(owner: str, backend: str) -> str:
    """``backend`` if a backend of that name is installed; else one :class:`InvalidParameterError`
    naming those that are. Reads metadata only."""
    names = backend_names()
    if backend not in names:
        raise InvalidParameterError(owner, "backend", backend, "one of " + ", ".join(names))
    return backend


def _entry(name: str) -> PluginEntry:
    found = next((entry for entry in installed(GROUP) if entry.name == name), None)
    return found or PluginEntry(
        group=GROUP, name=name, distribution="qinsight", version="(source)", target=BUILTIN_BACKENDS[name]
    )


_LOADED: dict[PluginEntry, Backend] = {}  # one record per installed entry: bounded by what is installed


def get_backend(backend: str, owner: str = "backend") -> Backend:
    """The record of ``backend`` (imported on first use); one :class:`InvalidParameterError` if no
    backend of that name is installed, one :class:`PluginLoadError` if its record cannot be loaded."""
    entry = _entry(check_backend(owner, backend))
    if entry not in _LOADED:
        record = load_entry(entry, kind="backend")
        if not isinstance(record, Backend) or record.name != backend:
            got = f"backend {record.name!r}" if isinstance(record, Backend) else type(record).__name__
            raise PluginLoadError(backend, entry.source, f"the entry point gives {got}, not the Backend {backend!r}")
        _LOADED[entry] = record
    return _LOADED[entry]


def find_backend(backend: str) -> Backend | None:
    """The record of ``backend``, or ``None`` where none of that name is installed here or it cannot be
    loaded: what a report file names may be another machine's backend, and it still reads and renders."""
    if backend not in backend_names():
        return None
    try:
        return get_backend(backend)
    except PluginLoadError:
        return None


def backend_lowering(owner: str, backend: str) -> Lowering:
    """The lowering of ``backend``; one :class:`InvalidParameterError` naming the backends that lower if none."""
    record = get_backend(backend, owner)
    if record.lowering is None:
        lowering = [name for name in backend_names() if (found := find_backend(name)) and found.lowering is not None]
        raise InvalidParameterError(
            owner, "backend", backend, "one whose program qinsight lowers: " + ", ".join(lowering)
        )
    return record.lowering


def _recognized(backend: Backend) -> tuple[type, ...]:
    """The quantizer classes ``backend`` recognizes; none where its extra is not installed."""
    if backend.pt2e is None:
        return ()
    try:
        return backend.pt2e.types()
    except MissingExtraError:
        return ()


def _own(quantizer: object, known: dict[str, tuple[type, ...]]) -> set[str]:
    """The backends one quantizer (not its parts) is an instance of, the most derived class winning: a
    subclass of XNNPACKQuantizer registered as a backend of its own is that backend's, not XNNPACK's."""
    matches = {name: [t for t in types if isinstance(quantizer, t)] for name, types in known.items()}
    matches = {name: types for name, types in matches.items() if types}
    return {
        name
        for name, types in matches.items()
        if not any(
            other != name and any(issubclass(o, t) and o is not t for o in others for t in types)
            for other, others in matches.items()
        )
    }


def backend_of(quantizer: object) -> Backend | None:
    """The backend ``quantizer`` quantizes for, seen through composition (``ComposableQuantizer``'s
    ``quantizers``, qinsight's wrappers' ``inner``): ``None`` where it is no installed backend's, or
    more than one's."""
    known = {name: _recognized(record) for name in backend_names() if (record := find_backend(name)) is not None}
    found: set[str] = set()
    pending = [quantizer]
    while pending:
        current = pending.pop()
        found |= _own(current, known)
        pending += list(getattr(current, "quantizers", ())) + ([current.inner] if hasattr(current, "inner") else [])
    return get_backend(found.pop()) if len(found) == 1 else None


def planned_backend(owner: str, backend: str | None, quantizer: object | None) -> str:
    """``backend`` as given, else the one the user's ``quantizer`` quantizes for, else x86; one error
    where the two disagree (an ``XNNPACKQuantizer`` judged as x86 would misread every finding)."""
    implied = backend_of(quantizer) if quantizer is not None else None
    if backend is None:
        return implied.name if implied is not None else DEFAULT_BACKEND
    check_backend(owner, backend)
    if implied is not None and implied.name != backend:
        expected = f"{implied.name!r}, the backend your {type(quantizer).__name__} quantizes for (or leave backend out)"
        raise InvalidParameterError(owner, "backend", backend, expected)
    return backend


__all__ = [
    "BUILTIN_BACKENDS",
    "DEFAULT_BACKEND",
    "PT2E_HINT",
    "GROUP",
    "AdviceQuantizer",
    "Backend",
    "Lowering",
    "Program",
    "Pt2eQuantizers",
    "backend_names",
    "backend_of",
    "check_backend",
    "find_backend",
    "get_backend",
    "is_quantizer",
    "backend_lowering",
    "planned_backend",
]
