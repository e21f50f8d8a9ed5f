"""The one-step pipeline: instrument → calibrate → analyze → remove.

:func:`instrument` is the context manager for users with their own
calibration loop; :func:`diagnose` runs that loop for them. Either way the
observers are gone when the ``with`` block ends, also when calibration raised,
and the model is left as it was given.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight._version import __version__
from qinsight.core.comparison import Comparison
from qinsight.core.equalization import EqualizationEntry, EqualizationMapping
from qinsight.core.errors import CalibrationError
from qinsight.core.report import (
    DetectorFailure,
    DetectorResult,
    FailureStage,
    Report,
    ReportMetadata,
)
from qinsight.core.sites import InsertPoint, check_backend
from qinsight.core.stats import ObservedStats
from qinsight.core.suggestions import merge_suggestions
from qinsight.frontends import Frontend, eval_mode, run_batch, view_of
from qinsight.observe.instrumenter import Instrumenter
from qinsight.plugin.detector import Detector, ModelView, check_result
from qinsight.plugin.discovery import DEFAULT_IDS, resolve_detectors

Progress = Callable[[int], None]
_NOTHING = object()  # what an exhausted calibration iterator gives


def default_detectors(backend: str = "x86") -> tuple[Detector, ...]:
    """The built-in detectors with their default parameters."""
    detectors, _ = resolve_detectors(DEFAULT_IDS, backend=backend, strict=True)
    return detectors


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _next_batch(batches: Iterator[object], index: int) -> object:
    """The next batch, ``_NOTHING`` at the end; the data's own error as a :class:`CalibrationError`."""
    try:
        batch = next(batches, _NOTHING)
    except Exception as exc:
        raise CalibrationError(f"the calibration data raised at batch {index}: {_describe(exc)}", batch=index) from exc
    if batch is None:
        raise CalibrationError(f"calibration batch {index} is None, not a tensor, tuple or mapping", batch=index)
    return batch


class Session:
    """An instrumented model: calibrate it, then ask for the :class:`Report`."""

    def __init__(
        self,
        view: ModelView,
        detectors: Sequence[Detector],
        *,
        backend: str,
        model_name: str,
        strict: bool,
        load_failures: Sequence[DetectorFailure] = (),
    ) -> None:
        self.view = view
        self.detectors = tuple(detectors)
        self._backend = backend
        self._model_name = model_name
        self._strict = strict
        self._failures: list[DetectorFailure] = list(load_failures)
        self._points: dict[str, tuple[InsertPoint, ...]] = {}
        for detector in self.detectors:
            try:
                points = tuple(detector.insert_points(view))
                for point in points:
                    view.site(point.fqn)  # an unknown module fails this detector, not the session
                self._points[detector.id] = points
            except Exception as exc:
                self._fail(detector, FailureStage.INSERT_POINTS, exc)
        self._instrumenter = Instrumenter(view, (p for points in self._points.values() for p in points))
        self._forwards = 0
        self._frozen: ObservedStats | None = None

    def _fail(self, detector: Detector, stage: FailureStage, exc: Exception) -> None:
        if self._strict:
            raise exc
        self._failures.append(DetectorFailure(detector=detector.id, stage=stage, error=_describe(exc)))

    @property
    def batches(self) -> int:
        """Forward passes of the model seen so far."""
        return self._forwards

    def _count_forward(self, _module: nn.Module, _args: tuple[object, ...]) -> None:
        self._forwards += 1

    @contextlib.contextmanager
    def _attached(self) -> Iterator[None]:
        remove_counter = self.view.model.register_forward_pre_hook(self._count_forward).remove
        try:
            self._instrumenter.attach()
            yield
        finally:
            self._instrumenter.detach()
            remove_counter()
        # frozen only when the block ended normally: an error inside it is the one to see
        self._frozen = self._instrumenter.freeze()

    def calibrate(self, data: Iterable[object], progress: Progress | None = None) -> int:
        """Run every batch of ``data`` through the model in eval mode, without gradients.

        The training flags of all submodules are restored afterwards. A batch
        that raises becomes a :class:`CalibrationError` naming its index.
        """
        model = self.view.model
        count = 0
        batches = iter(data)
        with eval_mode(model), torch.no_grad():
            for index in itertools.count():
                batch = _next_batch(batches, index)
                if batch is _NOTHING:
                    break
                try:
                    run_batch(model, batch)
                except Exception as exc:
                    seen = self._instrumenter.take_error()
                    also = f" (and {seen})" if seen is not None else ""
                    raise CalibrationError(f"calibration batch {index} failed: {_describe(exc)}{also}", batch=index) from exc
                self._raise_observer_error(index)
                count += 1
                if progress is not None:
                    progress(count)
        return count

    def _raise_observer_error(self, batch: int | None) -> None:
        seen = self._instrumenter.take_error()
        if seen is not None:
            where = f"calibration batch {batch}" if batch is not None else "a calibration batch"
            raise CalibrationError(f"{where} failed: {_describe(seen)}", batch=batch) from seen

    def stats(self) -> ObservedStats:
        return self._frozen if self._frozen is not None else self._instrumenter.freeze()

    def report(self) -> Report:
        """Analyze what was observed so far; raises :class:`CalibrationError` if nothing ran."""
        if self._forwards == 0:
            raise CalibrationError(
                "no calibration batches ran: the calibration data was empty or the model was never called "
                "inside the instrument() block"
            )
        self._raise_observer_error(None)  # from the user's own loop under instrument()
        stats = self.stats()
        results: list[DetectorResult] = []
        for detector in self.detectors:
            if detector.id not in self._points:
                continue  # failed before calibration, already recorded
            try:
                results.append(check_result(detector, detector.analyze(self.view, stats)))
            except Exception as exc:
                self._fail(detector, FailureStage.ANALYZE, exc)
        suggestions, conflicts = merge_suggestions(s for r in results for s in r.suggestions)
        equalize = tuple(EqualizationEntry(fqn=s.fqn, sources=s.sources) for s in suggestions if s.equalize)
        return Report(
            metadata=ReportMetadata(
                model=self._model_name,
                frontend=self.view.frontend,
                backend=self._backend,
                batches=self._forwards,
                qinsight_version=__version__,
                torch_version=torch.__version__,
            ),
            sites=self.view.sites,
            observations=stats.observations,
            results=tuple(results),
            suggestions=suggestions,
            conflicts=conflicts,
            equalization_mapping=EqualizationMapping(entries=equalize),
            failures=tuple(self._failures),
        )


DetectorChoice = Detector | str


def _choose(
    detectors: Sequence[DetectorChoice] | None, backend: str, strict: bool
) -> tuple[tuple[Detector, ...], tuple[DetectorFailure, ...]]:
    """Detector instances for ``detectors``: instances as given, ids loaded from the registry."""
    if detectors is None:
        return resolve_detectors(None, backend=backend, strict=strict)
    if not detectors:
        raise ValueError("detectors is empty: pass at least one detector, or None for the defaults")
    chosen: list[Detector] = []
    failures: list[DetectorFailure] = []
    for detector in detectors:
        if isinstance(detector, str):
            loaded, failed = resolve_detectors([detector], backend=backend, strict=strict)
            chosen.extend(loaded)
            failures.extend(failed)
        else:
            chosen.append(detector)
    return tuple(chosen), tuple(failures)


def _session(
    model: nn.Module,
    detectors: Sequence[DetectorChoice] | None,
    backend: str,
    qconfig_mapping: QConfigMapping | None,
    model_name: str | None,
    strict: bool,
    frontend: Frontend = "auto",
    example: object | None = None,
) -> Session:
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()  # the program's own graph cannot run; its module can
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or an ExportedProgram, not {type(model).__name__}")
    check_backend("diagnose", backend)
    chosen, load_failures = _choose(detectors, backend, strict)
    ids = [d.id for d in chosen]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"each detector may run once per diagnosis; given more than once: {', '.join(repeated)}")
    view = view_of(model, frontend, qconfig_mapping, example)
    name = model_name or type(model).__name__
    return Session(view, chosen, backend=backend, model_name=name, strict=strict, load_failures=load_failures)


@contextlib.contextmanager
def instrument(
    model: nn.Module,
    *,
    detectors: Sequence[DetectorChoice] | None = None,
    backend: str = "x86",
    qconfig_mapping: QConfigMapping | None = None,
    model_name: str | None = None,
    strict: bool = False,
    frontend: Frontend = "auto",
    example_inputs: object | None = None,
) -> Iterator[Session]:
    """Observe ``model`` inside a ``with`` block; call ``session.report()`` inside or after it.

    >>> with qinsight.instrument(model) as session:       # doctest: +SKIP
    ...     for batch in loader:
    ...         model(batch)
    >>> report = session.report()                          # doctest: +SKIP

    A model FX cannot trace needs ``example_inputs`` (one batch) for the eager frontend.
    """
    session = _session(model, detectors, backend, qconfig_mapping, model_name, strict, frontend, example_inputs)
    with session._attached():
        yield session


def diagnose(
    model: nn.Module,
    calibration_data: Iterable[Any],
    *,
    detectors: Sequence[DetectorChoice] | None = None,
    backend: str = "x86",
    qconfig_mapping: QConfigMapping | None = None,
    model_name: str | None = None,
    strict: bool = False,
    progress: Progress | None = None,
    frontend: Frontend = "auto",
) -> Report:
    """Instrument ``model``, calibrate it on ``calibration_data``, and return the :class:`Report`.

    ``model`` is any ``nn.Module`` or a ``torch.export`` ExportedProgram. With
    ``frontend="auto"``: exported graphs (``ep.module()``, ``prepare_pt2e``)
    through the exported-graph frontend, FX-traceable models and ``prepare_fx``
    graphs through FX, anything else through the eager frontend, which finds
    its sites by running the first batch. ``calibration_data`` is any iterable of batches (a tensor, a
    tuple of positional arguments, or a mapping of keyword arguments).
    ``detectors`` holds detector instances or ids (``"qinsight.outliers"``,
    or a plugin's); ``None`` means the ``QINSIGHT_DETECTORS`` allowlist if set,
    else the four built-ins. A detector that fails to load is recorded in
    ``report.failures`` and the others run.
    ``qconfig_mapping`` is the mapping you plan to quantize with; it tells the
    detectors what each module would get. With ``strict=True`` a failing
    detector raises instead of being recorded in ``report.failures``.
    """
    batches = iter(calibration_data)
    first = _next_batch(batches, 0)
    example = None if first is _NOTHING else first
    with instrument(
        model,
        detectors=detectors,
        backend=backend,
        qconfig_mapping=qconfig_mapping,
        model_name=model_name,
        strict=strict,
        frontend=frontend,
        example_inputs=example,
    ) as session:
        session.calibrate(itertools.chain([first], batches) if example is not None else (), progress)
    return session.report()


def comparison_report(comparison: Comparison, *, model_name: str = "model") -> Report:
    """A report file's worth holding only ``comparison``, for when no diagnosis ran.

    To keep a comparison with a diagnosis instead: ``report.with_comparison(comparison)``.
    """
    measured = comparison.activations.layers if comparison.activations is not None else ()
    return Report(
        metadata=ReportMetadata(
            model=model_name,
            frontend="",
            backend="",
            batches=max((layer.batches for layer in measured), default=0),
            qinsight_version=__version__,
            torch_version=torch.__version__,
        ),
        sites=(),
        observations=(),
        results=(),
        suggestions=(),
        comparison=comparison,
    )
