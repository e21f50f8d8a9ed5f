"""The one-step pipeline: instrument → calibrate → analyze → remove.

:func:`instrument` is the context manager for users with their own
calibration loop; :func:`diagnose` runs that loop for them. Either way the
observers are gone when the ``with`` block ends, also when calibration raised,
and the model is left as it was given.

With ``distributed=True`` each rank of an initialized process group
calibrates on its own shard of the data (docs/scale.md); ``report()`` then
gathers every rank's frozen statistics, merges them, runs the detectors once
on rank 0 and gives every rank the same report.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, Literal

import attrs
import torch
from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.backend import check_backend, planned_backend
from qinsight.core.errors import CalibrationError, InvalidParameterError, describe
from qinsight.core.flows import equalizes, observes_activations
from qinsight.core.fx_activations import FxActivations
from qinsight.core.options import Deployment
from qinsight.core.options import options as chosen_options
from qinsight.core.progress import Progress
from qinsight.core.report import DetectorFailure, FailureStage, Report
from qinsight.core.shards import Shard
from qinsight.core.sites import Frontend, InsertPoint
from qinsight.core.stats import ObservedStats
from qinsight.distributed import Exchange, sharing_failures
from qinsight.frontends import eval_mode, example_inputs, run_batch, view_of
from qinsight.frontends.configured import configure_by_quantizer
from qinsight.observe.instrumenter import Instrumenter
from qinsight.pipeline.analysis import DetectorChoice, analyze, choose_detectors, metadata
from qinsight.pipeline.equalizable import refused_equalizations
from qinsight.pipeline.verifier import VERIFY_BATCHES, chosen_flows, lowering_of, verify_report
from qinsight.plugin.detector import Detector, ModelView

_NOTHING = object()  # what an exhausted calibration iterator gives


def _next_batch(batches: Iterator[object], index: int) -> object:
    """The next batch, ``_NOTHING`` at the end; the data's own error as a :class:`CalibrationError`."""
    try:
        batch = next(batches, _NOTHING)
    except Exception as exc:
        raise CalibrationError(f"the calibration data raised at batch {index}: {describe(exc)}", batch=index) from exc
    if batch is None:
        raise CalibrationError(f"calibration batch {index} is None, not a tensor, tuple or mapping", batch=index)
    return batch


def _check_not_empty(batch: object, index: int) -> None:
    """A batch whose every tensor holds no values (zero rows) observes nothing and scores nothing:
    one :class:`CalibrationError` naming it, not torch's error from deep inside a reshape."""
    tensors = [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    if tensors and all(t.numel() == 0 for t in tensors):
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors[:3])
        said = (
            f"calibration batch {index} is empty (shape {shapes}): "
            "drop batches with zero rows from the calibration data"
        )
        raise CalibrationError(said, batch=index)


def _as_batch(args: tuple[object, ...], kwargs: dict[str, object]) -> object | None:
    """A forward call's arguments as a batch (:func:`~qinsight.frontends.batch_arguments`), if one can say them."""
    if kwargs and args:
        return None
    return dict(kwargs) if kwargs else tuple(args)


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
        shard: Shard | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self.view = view
        self.detectors = tuple(detectors)
        self._backend = backend
        self._model_name = model_name
        self._strict = strict
        self._exchange = exchange
        self._shard = exchange.shard if exchange is not None else shard
        self._failures: list[DetectorFailure] = list(load_failures)
        self._points: dict[str, tuple[InsertPoint, ...]] = {}
        for detector in self.detectors:
            try:
                points = tuple(detector.insert_points(view))
                for point in points:
                    view.site(point.fqn)  # an unknown module fails this detector, not the session
                self._points[detector.id] = points
            except Exception as exc:
                if strict:
                    raise
                self._failures.append(
                    DetectorFailure(detector=detector.id, stage=FailureStage.INSERT_POINTS, error=describe(exc))
                )
        self._instrumenter = Instrumenter(view, (p for points in self._points.values() for p in points))
        self._forwards = 0
        self._example: object | None = None  # the first batch, to check the suggested equalizations on
        self._frozen: ObservedStats | None = None
        self._report: Report | None = None

    @property
    def batches(self) -> int:
        """Forward passes of the model seen so far (in this process)."""
        return self._forwards

    def _count_forward(self, _module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        if self._forwards == 0:
            self._example = _as_batch(args, kwargs)
        shard = self._shard
        self._instrumenter.clock.index = shard.batch_index(self._forwards) if shard is not None else self._forwards
        self._forwards += 1

    @contextlib.contextmanager
    def _attached(self) -> Iterator[None]:
        remove_counter = self.view.model.register_forward_pre_hook(self._count_forward, with_kwargs=True).remove
        try:
            self._instrumenter.attach()
            yield
        finally:
            self._instrumenter.detach()
            remove_counter()
        # frozen only when the block ended normally: an error inside it is the one to see
        self._frozen = self._instrumenter.freeze()

    def calibrate(self, data: Iterable[object], progress: Progress | None = None, *, total: int | None = None) -> int:
        """Run every batch of ``data`` through the model in eval mode, without gradients.

        The training flags of all submodules are restored afterwards. A batch
        that raises becomes a :class:`CalibrationError` naming its index.
        ``total``: the number of batches for ``progress`` where ``data`` cannot say it (an iterator).
        """
        model = self.view.model
        count = 0
        if total is None:
            total = len(data) if isinstance(data, Sized) else 0
        batches = iter(data)
        if progress is not None:
            progress("calibrating", 0, total)  # the stage's clock starts before its first batch
        with eval_mode(model), torch.no_grad():
            for local in itertools.count():
                index = (
                    self._shard.batch_index(local) if self._shard is not None else local
                )  # as numbered in all the data
                batch = _next_batch(batches, index)
                if batch is _NOTHING:
                    break
                _check_not_empty(batch, index)
                try:
                    run_batch(model, batch)
                except Exception as exc:
                    seen = self._instrumenter.take_error()
                    also = f" (and {seen})" if seen is not None else ""
                    raise CalibrationError(
                        f"calibration batch {index} failed: {describe(exc)}{also}", batch=index
                    ) from exc
                self._raise_observer_error(index)
                count += 1
                if progress is not None:
                    progress("calibrating", count, total)
        return count

    def _raise_observer_error(self, batch: int | None) -> None:
        seen = self._instrumenter.take_error()
        if seen is not None:
            where = f"calibration batch {batch}" if batch is not None else "a calibration batch"
            raise CalibrationError(f"{where} failed: {describe(seen)}", batch=batch) from seen

    def stats(self) -> ObservedStats:
        """The statistics of this process's batches."""
        return self._frozen if self._frozen is not None else self._instrumenter.freeze()

    def report(self) -> Report:
        """Analyze what was observed so far; raises :class:`CalibrationError` if nothing ran.

        In a distributed session this is a collective: every rank calls it,
        and every rank gets the report of all ranks' batches.
        """
        exchange = self._exchange
        if exchange is None:
            self._raise_observer_error(None)  # from the user's own loop under instrument()
            return self._analyze(self.stats(), self._forwards)
        if self._report is None:
            with sharing_failures(exchange):
                self._raise_observer_error(None)
                shards = exchange.gather((self.stats(), self._forwards))
                merged, forwards = ObservedStats.merged([s for s, _ in shards]), sum(n for _, n in shards)
                self._report = exchange.from_rank0(lambda: self._analyze(merged, forwards))
        return self._report

    def _analyze(self, stats: ObservedStats, forwards: int) -> Report:
        if forwards == 0:
            raise CalibrationError(
                "no calibration batches ran: the calibration data was empty or the model was never called "
                "inside the instrument() block"
            )
        report = analyze(
            self.view,
            [d for d in self.detectors if d.id in self._points],  # the others failed before calibration, recorded
            stats,
            metadata=metadata(self._model_name, self.view.frontend, self._backend, forwards),
            failures=self._failures,
            strict=self._strict,
        )
        report = report.with_equalization_refused(self._refused_equalizations(report.equalization_mapping.fqns))
        return attrs.evolve(report, fx_activations=self._fx_activations())

    def _fx_activations(self) -> FxActivations | None:
        """How the report's FX config observes activations: qinsight's way, its kernels checked where the
        config is verified (:func:`~qinsight.pipeline.saturation.kernels_checked`)."""
        if self._example is None or not observes_activations(self.view.frontend, self._backend):
            return None  # PT2E observes 8 bits after the clips already
        return FxActivations(checked=False)

    def _refused_equalizations(self, fqns: tuple[str, ...]) -> dict[str, str]:
        """The suggested equalizations torch cannot apply (:mod:`.equalizable`), checked on the first batch."""
        if not fqns or self._example is None or not equalizes(self.view.frontend, self._backend):
            # PT2E has no equalization at all (XNNPACK's only flow), which qinsight.pt2e_quantizer(report) says
            return {}
        return refused_equalizations(self.view.model, fqns, self._example, self._backend)


def _planned(qconfig_mapping: object | None, quantizer: object | None) -> QConfigMapping | object | None:
    """The config the user plans to quantize with: an FX mapping or a PT2E quantizer, not both."""
    if qconfig_mapping is not None and not isinstance(qconfig_mapping, QConfigMapping):
        expected = "a torch QConfigMapping (the FX config you plan to quantize with) or None"
        raise InvalidParameterError("diagnose", "qconfig_mapping", type(qconfig_mapping).__name__, expected)
    if qconfig_mapping is not None and quantizer is not None:
        expected = "None beside qconfig_mapping= (one planned config: FX's or PT2E's)"
        raise InvalidParameterError("diagnose", "quantizer", type(quantizer).__name__, expected)
    return quantizer if quantizer is not None else qconfig_mapping


@attrs.frozen(kw_only=True)
class SessionOptions:
    """What :func:`diagnose` and :func:`instrument` set a session up with, checked and resolved
    (``owner``: the one the user called, named in its errors; ``planned``: the QConfigMapping or PT2E
    quantizer the findings are judged against; ``example``: the batch the model is read with, from the
    argument ``example_from`` names)."""

    owner: str
    detectors: Sequence[DetectorChoice] | None
    backend: str
    planned: object | None
    model_name: str | None
    strict: bool
    frontend: Frontend
    example: object | None
    example_from: str
    shard: Shard | None
    exchange: Exchange | None


def _session(model: nn.Module, options: SessionOptions) -> Session:
    owner = options.owner
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()  # the program's own graph cannot run; its module can
    if not isinstance(model, nn.Module):
        raise InvalidParameterError(owner, "model", type(model).__name__, "a torch.nn.Module or an ExportedProgram")
    if options.shard is not None and options.exchange is not None:
        expected = "None with distributed=True (the process group says which shard)"
        raise InvalidParameterError(owner, "shard", options.shard, expected)
    check_backend(owner, options.backend)
    chosen, load_failures = choose_detectors(options.detectors, options.backend, options.strict)
    planned = options.planned
    mapping = planned if planned is None or isinstance(planned, QConfigMapping) else None
    view = view_of(model, options.frontend, mapping, options.example, options.backend)
    if planned is not None and mapping is None:  # a PT2E quantizer: asked on the exported graph
        if options.example is None:
            expected = "a batch, for the quantizer= to annotate"
            raise InvalidParameterError(owner, options.example_from, None, expected)
        configure_by_quantizer(view, planned, example_inputs(options.example))
    return Session(
        view,
        chosen,
        backend=options.backend,
        model_name=options.model_name or type(model).__name__,
        strict=options.strict,
        load_failures=load_failures,
        shard=options.shard,
        exchange=options.exchange,
    )


@contextlib.contextmanager
def instrument(
    model: nn.Module,
    *,
    detectors: Sequence[DetectorChoice] | None = None,
    backend: str | None = None,
    qconfig_mapping: QConfigMapping | None = None,
    model_name: str | None = None,
    strict: bool = False,
    frontend: Frontend = "auto",
    example_inputs: object | None = None,
    distributed: bool = False,
    shard: Shard | None = None,
    quantizer: object | None = None,
) -> Iterator[Session]:
    """Observe ``model`` inside a ``with`` block, for your own calibration loop; call ``session.report()``
    inside or after it.

    >>> with qinsight.instrument(model) as session:       # doctest: +SKIP
    ...     for batch in loader:
    ...         model(batch)
    >>> report = session.report()                          # doctest: +SKIP

    Args:
        model: as for :func:`diagnose`.
        detectors, backend, qconfig_mapping, model_name, strict, frontend, shard, quantizer: as for
            :func:`diagnose`.
        example_inputs: one batch: a model FX cannot trace needs it for the eager frontend; so does
            ``quantizer=``.
        distributed: every rank runs the block on its own batches and calls ``report()``; an error in the
            block on one rank ends the others' ``report()`` with a :class:`ShardError` naming it.

    Returns:
        The :class:`Session`, whose ``report()`` gives the :class:`Report` (not verified: call
        :func:`verify_report` on it).
    """
    exchange = Exchange.of("instrument", distributed)
    with sharing_failures(exchange):
        planned = _planned(qconfig_mapping, quantizer)
        chosen = planned_backend("instrument", backend, quantizer)
        options = SessionOptions(
            owner="instrument",
            detectors=detectors,
            backend=chosen,
            planned=planned,
            model_name=model_name,
            strict=strict,
            frontend=frontend,
            example=example_inputs,
            example_from="example_inputs",
            shard=shard,
            exchange=exchange,
        )
        session = _session(model, options)
        with session._attached():
            yield session


def _former_shard(owner: str, shard: Shard | str | None, former: dict[str, Any]) -> Shard | str | None:
    """``shard``, or ``"distributed"`` where the former ``distributed=True`` is given (taken out of
    ``former``, warned of); ``shard`` is checked: a :class:`Shard`, ``"distributed"`` or None."""
    if "distributed" in former:
        distributed = former.pop("distributed")
        warnings.warn(
            f'{owner}(distributed=True) is now {owner}(shard="distributed"); the keyword goes in the next release',
            DeprecationWarning,
            stacklevel=3,
        )
        if distributed:
            if shard is not None:
                raise InvalidParameterError(owner, "shard", shard, "None with distributed=True")
            return "distributed"
    if shard is not None and shard != "distributed" and not isinstance(shard, Shard):
        expected = 'a qinsight.types.Shard, "distributed" (inside a process group) or None'
        raise InvalidParameterError(owner, "shard", shard, expected)
    return shard


def diagnose(
    model: nn.Module,
    calibration_data: Iterable[Any],
    *,
    detectors: Sequence[DetectorChoice] | None = None,
    deploy: Deployment | str | object | None = None,
    frontend: Frontend = "auto",
    verify: bool | str | Sequence[str] | None = None,
    progress: Progress | None = None,
    shard: Shard | Literal["distributed"] | None = None,
    model_name: str | None = None,
    strict: bool = False,
    **former: Any,
) -> Report:
    """Instrument ``model``, calibrate it on ``calibration_data``, and return the :class:`Report`.

    Args:
        model: any ``nn.Module`` or a ``torch.export`` ExportedProgram, read by ``frontend``.
        calibration_data: an iterable of batches (a tensor, a tuple of positional arguments, or a mapping
            of keyword arguments), read once, lazily.
        detectors: detector instances or ids (``"qinsight.outliers"``, or a plugin's); ``None``: the
            ``QINSIGHT_DETECTORS`` allowlist if set, else the six built-ins. One that fails to load is
            recorded in ``report.failures`` and the others run.
        deploy: where the model goes: a :class:`~qinsight.core.options.Deployment`, or its shorthand
            (a backend's name, ``"xnnpack"``; your PT2E quantizer). ``backend``: the backend you
            quantize for (``None``: your quantizer's, else x86). ``qconfig_mapping``: the FX mapping you
            plan to quantize with: it tells the detectors what each module would get. ``quantizer``:
            its PT2E counterpart, the torchao ``Quantizer`` you plan to apply (``XNNPACKQuantizer``,
            ``X86InductorQuantizer``, a ``ComposableQuantizer``), asked on the exported first batch
            which layers it quantizes with which weight scheme and which ops around them
            (:mod:`qinsight.frontends.configured`); the backend must be the one it is for. ``lowered``
            (PT2E): each config verified as the program lowered for the backend. ``flow``: the flow to
            verify in where ``verify`` names none.
        frontend: ``"auto"``: exported graphs (``ep.module()``, ``prepare_pt2e``) through the
            exported-graph frontend, FX-traceable models and ``prepare_fx`` graphs through FX, anything
            else through the eager frontend, which finds its sites by running the first batch.
        shard: ``"distributed"``: inside an initialized process group, called on every rank with that
            rank's batches (``qinsight.shard(data)``): every rank returns the report of all ranks' batches
            (docs/scale.md); distributed runs are not verified (``qinsight.verify_report`` on one rank
            does it). Without a process group, ``qinsight.types.Shard(rank=i, world_size=n)`` calibrates batches
            ``i, i + n, ...`` of the data (numbered as in the whole data), for reports that
            :func:`~qinsight.pipeline.merge.merge_reports` combines later.
        verify: the report's config quantized for real and scored in the frontend's flow (FX for a traced
            model, PT2E for an exported one, PT2E and torchao for one FX cannot trace; or the flows named
            among ``"fx"``, ``"pt2e"``, ``"torchao"``), each kind of suggestion that lowers the score
            dropped (:mod:`qinsight.pipeline.verifier`, on the first :data:`VERIFY_BATCHES` batches).
            ``False`` for speed: the report then says its config is unverified. ``None``: as the
            ``QINSIGHT_VERIFY`` environment variable says, else ``True``.
        progress: called at each stage (the command line's progress line).
        model_name: the name the report gives the model (default: its class).
        strict: a failing detector raises instead of being recorded in ``report.failures``.
        former: ``backend=``, ``qconfig_mapping=``, ``quantizer=``, ``lowered=`` (now ``deploy``'s) and
            ``distributed=True`` (now ``shard="distributed"``), for one release, with a ``DeprecationWarning``.

    Returns:
        The report: each detector's findings, the suggested config, the equalization mapping and, where
        verified, each flow's verdict on the config.

    Raises:
        InvalidParameterError: an argument outside what it takes, before any batch runs.
        CalibrationError: the calibration data raised, or a batch is empty.
        FrontendError: no frontend can read the model.
    """
    if not isinstance(calibration_data, Iterable) or isinstance(calibration_data, (str, bytes)):
        expected = "an iterable of batches (a list of tensors, a DataLoader...)"
        raise InvalidParameterError("diagnose", "calibration_data", type(calibration_data).__name__, expected)
    asked = _former_shard("diagnose", shard, former)
    _goal, deployment, _resources = chosen_options("diagnose", None, deploy, former, takes=("deploy",))
    quantizer, qconfig_mapping, lowered = deployment.quantizer, deployment.qconfig_mapping, deployment.lowered
    if verify is None and deployment.flow is not None:
        verify = deployment.flow
    exchange = Exchange.of("diagnose", asked == "distributed")
    shard = asked if isinstance(asked, Shard) else None
    backend = planned_backend("diagnose", deployment.backend, quantizer)
    with sharing_failures(exchange):
        batches = iter(calibration_data)
        mine = exchange.shard if exchange is not None else shard
        first = _next_batch(batches, mine.batch_index(0) if mine is not None else 0)
        example = None if first is _NOTHING else first
        planned = _planned(qconfig_mapping, quantizer)
        options = SessionOptions(
            owner="diagnose",
            detectors=detectors,
            backend=backend,
            planned=planned,
            model_name=model_name,
            strict=strict,
            frontend=frontend,
            example=example,
            example_from="calibration_data",
            shard=shard,
            exchange=exchange,
        )
        session = _session(model, options)
        flows = chosen_flows("diagnose", verify, session.view.frontend, backend, quantizer) if exchange is None else ()
        if lowered:  # checked before calibration: a flow whose model is not lowered is one error now
            lowering_of("diagnose", flows, backend)
        kept: list[object] = []  # the first batches, to verify the config on

        def keeping(batch: object) -> object:
            if flows and len(kept) < VERIFY_BATCHES:
                kept.append(batch)
            return batch

        with session._attached():
            data = itertools.chain([first], batches) if example is not None else ()
            total = len(calibration_data) if isinstance(calibration_data, Sized) else 0
            session.calibrate(map(keeping, data), progress, total=total)
        report = session.report()
    if not flows:
        return report
    return verify_report(model, report, kept, flows=flows, progress=progress, lowered=lowered, quantizer=quantizer)
