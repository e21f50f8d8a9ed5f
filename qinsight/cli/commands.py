"""The commands of ``qinsight``; torch is imported only by those that run a model."""

from __future__ import annotations

import argparse
import io
import json
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qinsight.cli import hf, ranks
from qinsight.cli.config_args import compared_flow, load_factory, planned_config
from qinsight.cli.gates import check_verdict_gates, parse_diff_gates, tripped_diff, tripped_findings, unverified
from qinsight.cli.output import Progress, check_targets, note, write, wrote
from qinsight.core.entry_points import installed
from qinsight.core.errors import InvalidParameterError, PluginLoadError, UsageError
from qinsight.core.flows import flow_spec
from qinsight.core.options import Deployment, Goal, Repairs, Resources, byte_count
from qinsight.core.plan import BUDGET_UNITS, Budget, BudgetUnit, SpeedBound, Target
from qinsight.core.report import Report
from qinsight.core.shards import Shard
from qinsight.core.sites import FLOWS
from qinsight.outputs.diff import diff_reports
from qinsight.outputs.files import write_atomically
from qinsight.outputs.schema import schema
from qinsight.outputs.serde import load_report, save_report
from qinsight.outputs.text import render_text
from qinsight.plugin.discovery import DETECTORS, OPT_IN_IDS, find_entry, load_detector_class, requested_ids

if TYPE_CHECKING:
    from torch import nn


def _model_and_data(
    args: argparse.Namespace, part: Shard | None, *, whole: bool = False
) -> tuple[nn.Module, Iterable[object], str]:
    """The model, the batches of this ``part`` (``whole``: all batches) and the model's name."""
    from torch import nn

    model: object
    data: object
    if not args.hf and (args.text or getattr(args, "eval_text", None)):
        raise UsageError("--text and --eval-text are for --hf (a model's own tokenizer reads them)")
    if args.example:
        from qinsight.examples import example

        if args.batches < 1:
            raise UsageError("--batches must be at least 1")
        chosen = example(args.example)
        model, data, name = (
            chosen.model(),
            ranks.batches(lambda: chosen.data(args.batches), part, whole=whole),
            chosen.name,
        )
    elif args.hf:
        if args.batches < 1:
            raise UsageError("--batches must be at least 1")
        model, tokenizer = hf.load(args.hf, quiet=args.quiet)
        data, name = ranks.batches(lambda: hf.calibration(args, tokenizer), part, whole=whole), Path(args.hf).name
        args.tokenizer = tokenizer  # a plan's evaluation text is tokenized the same way
    else:
        if not args.data:
            raise UsageError("--model needs --data (a function returning the calibration batches)")
        model, data = (
            load_factory(args.model, "--model")(),
            ranks.batches(load_factory(args.data, "--data"), part, whole=whole),
        )
        name = args.model.rpartition(":")[2]
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model gave {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(data, Iterable):
        raise UsageError(f"--data gave {type(data).__name__}, not an iterable of batches")
    return model, data, name


def _detector_ids(args: argparse.Namespace) -> list[str] | None:
    """The ``--detectors`` ids, each installed (an unknown id is an error, not an empty report)."""
    if not args.detectors:
        return None
    ids = [d.strip() for d in args.detectors.split(",") if d.strip()]
    for detector in ids:
        if find_entry(DETECTORS, detector) is None:
            known = ", ".join(e.name for e in installed(DETECTORS))
            raise UsageError(f"--detectors: no detector {detector!r} is installed; installed: {known}")
    return ids


def _diagnose(args: argparse.Namespace) -> int:
    detectors = _detector_ids(args)
    for line in check_verdict_gates(args.fail_on, detectors or requested_ids(None)):
        note(line)
    check_targets([args.out, args.html], [])
    launch, part = ranks.launched(), ranks.parse_shard(args.shard)
    if launch is not None and part is not None:
        raise UsageError("--shard is for runs without torchrun; under torchrun the ranks are the shards")
    verify = _verify(args)
    from qinsight.pipeline import diagnose  # torch: once the arguments are known to be right

    with ranks.process_group(launch):
        with ranks.checked_together(launch):
            mapping, quantizer = planned_config(args)
            model, data, name = _model_and_data(args, launch or part)
        progress = None if args.quiet else Progress()
        try:
            deployment = Deployment.named(
                "diagnose", backend=args.backend, qconfig_mapping=mapping, quantizer=quantizer, lowered=args.lowered
            )
            report = diagnose(
                model,
                data,
                deploy=deployment,
                model_name=name,
                detectors=detectors,
                progress=progress,
                shard="distributed" if launch is not None else part,
                verify=verify,
            )
        finally:
            if progress is not None:
                progress.finish()
        return _finish(report, args, writes=launch is None or launch.rank == 0)


def _verify(args: argparse.Namespace) -> bool | tuple[str, ...] | None:
    """``--no-verify``/``--verify FLOWS`` as ``diagnose``'s ``verify`` (neither: QINSIGHT_VERIFY, else the
    frontend's flow)."""
    if args.no_verify:
        if args.verify:
            raise UsageError("--verify and --no-verify: choose one")
        return False
    if args.verify is None:
        return None
    flows = tuple(name.strip() for name in args.verify.split(",") if name.strip())
    if not flows or any(name not in FLOWS for name in flows):
        raise UsageError(f"--verify {args.verify!r}: flows among {', '.join(FLOWS)} (comma-separated)")
    return flows


def _compare(args: argparse.Namespace) -> int:
    """Quantizes the model with torch's default for the flow, calibrated on the batches, and
    compares it with the float model on the same batches (``--lowered``: its lowered program too)."""
    check_targets([args.out, args.html], [])
    flow = compared_flow(args)
    launch = ranks.launched()
    if launch is not None and args.lowered:
        raise UsageError("--lowered runs in one process: run it without torchrun")
    # torch: once the arguments are known to be right
    from qinsight.compare import compare_activations, compare_lowered, compare_weights
    from qinsight.core.comparison import Comparison
    from qinsight.frontends import model_structure
    from qinsight.pipeline import comparison_report, quantize_candidates

    with ranks.process_group(launch):
        with ranks.checked_together(launch):
            model, data, name = _model_and_data(args, launch, whole=True)
            batches = list(data)  # every rank calibrates on all of them, then compares on its stride
            if not batches:
                raise UsageError("no batches to calibrate and compare on")
            from qinsight.apply.recipe import default_config  # torchao only for PT2E

            config, described = default_config(flow, args.backend)
        mine = batches if launch is None else batches[launch.rank :: launch.world_size]
        with warnings.catch_warnings():  # torch's and torchao's deprecation notices: nothing the user can act on
            warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|torchao)(\.|$)")
            quantized = quantize_candidates(model, {flow: config}, batches)[flow]
            structure = model_structure(model)  # one trace for both comparisons
            comparison = Comparison(
                quantized=f"{flow_spec(flow).converter} ({described})",
                weights=compare_weights(model, quantized, structure=structure),
                activations=compare_activations(
                    model, quantized, mine, structure=structure, distributed=launch is not None
                ),
                lowered=compare_lowered(model, quantized, mine, backend=args.backend) if args.lowered else None,
            )
        return _finish(comparison_report(comparison, model_name=name), args, writes=launch is None or launch.rank == 0)


def _evaluation_data(args: argparse.Namespace) -> list[object]:
    """The batches a plan is measured on, none of them a calibration batch."""
    if args.eval_batches < 1:
        raise UsageError("--eval-batches must be at least 1")
    if args.example:
        from qinsight.examples import example

        return list(example(args.example).data(args.batches + args.eval_batches)[args.batches :])
    if args.hf:
        return hf.evaluation(args, args.tokenizer)
    if not args.eval_data:
        raise UsageError("--model needs --eval-data (a function returning batches not used for calibration)")
    data = load_factory(args.eval_data, "--eval-data")()
    if not isinstance(data, Iterable):
        raise UsageError(f"--eval-data gave {type(data).__name__}, not an iterable of batches")
    return list(data)


def _goal(args: argparse.Namespace, unit: BudgetUnit) -> tuple[Target | None, Budget | None]:
    """``--target`` and ``--budget`` read, for a planner spending ``unit`` (float sites in fx and pt2e,
    bits in torchao); neither: ``sqnr>=30``. fx and pt2e take one or the other, torchao both."""
    budget = None
    if args.budget is not None:
        try:
            budget = Budget.parse(args.budget, unit, "plan")
        except InvalidParameterError as exc:
            flow = "--flow torchao" if unit == "bits" else "--flow fx or pt2e"
            raise UsageError(f"--budget {args.budget!r}: expected {exc.expected} with {flow}") from exc
        if unit == "float" and args.target is not None:
            raise UsageError("--target and --budget: a plan for fx or pt2e takes one (the best score within a budget)")
    text = args.target if args.target is not None else (None if budget is not None and unit == "float" else "sqnr>=30")
    if text is None:
        return None, budget
    if text.replace(" ", "").startswith(tuple(f"{name}<=" for name in BUDGET_UNITS)):
        raise UsageError(f"--target {text!r} is a size: --budget {text.strip()}")
    try:
        return Target.parse(text), budget
    except InvalidParameterError as exc:
        raise UsageError(f"--target {text!r}: expected {exc.expected}") from exc


def _speed(args: argparse.Namespace, formats: bool) -> SpeedBound | None:
    """``--speed`` read: only where the plan lowers its configs (``--lowered``, not a format plan)."""
    if args.speed is None:
        return None
    if formats or not args.lowered:
        raise UsageError("--speed bounds the program a PT2E plan lowers: add --lowered (a pt2e flow's backend)")
    try:
        return SpeedBound.parse(args.speed)
    except InvalidParameterError as exc:
        raise UsageError(f"--speed {args.speed!r}: expected {exc.expected}") from exc


def _plan(args: argparse.Namespace) -> int:
    """A plan (``--flow torchao``: a format plan) of the model; under ``torchrun`` every rank runs it on
    a share of the evaluation batches and rank 0 speaks (docs/scale.md)."""
    check_targets([args.out, args.html], [])
    # a torchao plan's report says what each format loses on each Linear too (the formats detector)
    requested = requested_ids(None)
    formats = args.flow is not None and flow_spec(args.flow).plans_formats  # a format per Linear: plan_formats
    detectors = [*requested, *(d for d in OPT_IN_IDS if d not in requested)] if formats else None
    for line in check_verdict_gates(args.fail_on, detectors or requested):
        note(line)
    goal, formats_asked = _plan_goal(args, formats)  # before anything loads or runs
    if args.memory_budget is not None:
        byte_count("plan", "memory_budget", args.memory_budget)
    launch = ranks.launched()
    if launch is not None and formats:
        raise UsageError("--flow torchao plans run in one process: run it without torchrun")
    with ranks.process_group(launch):
        with ranks.checked_together(launch):
            model, data, name = _model_and_data(args, launch, whole=True)
            calibration, evaluation = list(data), _evaluation_data(args)
            if not calibration:
                raise UsageError("no batches to calibrate on")
        progress = None if args.quiet else Progress()
        try:
            with warnings.catch_warnings():  # torch's and torchao's deprecation notices: nothing the user can act on
                warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|torchao)(\.|$)")
                chosen = (goal, formats_asked, detectors, launch is not None)
                report, missed = _planned(args, model, name, calibration, evaluation, chosen, progress)
        finally:
            if progress is not None:
                progress.finish()
        status = _finish(report, args, writes=launch is None or launch.rank == 0)
    if missed:
        note(missed)
        return 1
    return status


def _planned(
    args: argparse.Namespace,
    model: Any,
    name: str,
    calibration: list[Any],
    evaluation: list[Any],
    chosen: tuple[Goal, list[str], list[str] | None, bool],
    progress: Progress | None,
) -> tuple[Report, str]:
    """The model diagnosed and planned as ``chosen`` says (the goal, the formats of a format plan, the
    detectors, whether over the ranks): the report with its plan, and what the plan missed (``""``: none)."""
    from qinsight.outputs.format_plans import verdict
    from qinsight.pipeline import diagnose  # torch: once the arguments are known to be right
    from qinsight.planning import plan, plan_formats

    goal, formats, detectors, distributed = chosen
    mapping, quantizer = planned_config(args)
    report = diagnose(
        model,
        calibration,
        model_name=name,
        detectors=detectors,
        deploy=Deployment.named("diagnose", backend=args.backend, qconfig_mapping=mapping, quantizer=quantizer),
        verify=None if formats else False,  # a plan in fx or pt2e verifies its own config, against the target
    )
    if formats:
        planned = plan_formats(model, evaluation, formats=formats, goal=goal, progress=progress)
        return report.with_formats(planned), "" if planned.reached else f"the plan: {verdict(planned)}"
    found = plan(
        model,
        calibration,
        evaluation,
        goal=goal,
        deploy=Deployment.named("plan", flow=args.flow, backend=args.backend, lowered=args.lowered),
        report=report,
        progress=progress,
        repairs=Repairs(smoothing=args.smooth, bias_correction=args.correct_biases),
        resources=Resources(memory_budget=args.memory_budget, shard="distributed" if distributed else None),
    )
    return report.with_plan(found), "" if found.reached else f"the plan does not reach {found.aim}"


def _plan_goal(args: argparse.Namespace, formats: bool) -> tuple[Goal, list[str]]:
    """``--target``, ``--budget``, ``--confidence`` (and ``--formats`` for a format plan) as the plan's
    goal, checked before anything loads: a language-model target of a format plan held at the 0.95 bound
    unless told."""
    target, budget = _goal(args, "bits" if formats else "float")
    speed = _speed(args, formats)
    if not formats:
        if args.confidence is not None and (target is None or target.metric != "top1"):
            raise UsageError(
                "--confidence holds a top1 target at its bound (with --flow torchao: a language-model target)"
            )
        return Goal(target=target, budget=budget, confidence=args.confidence, speed=speed), []
    from qinsight.planning.formats import format_goal
    from qinsight.planning.scores import PER_POSITION

    language = target is not None and target.metric in PER_POSITION  # bounded over the batch means
    confidence = args.confidence if args.confidence is not None else 0.95 if language else None
    goal = Goal(target=target, budget=budget, confidence=confidence)
    checked = format_goal(args.formats, goal)
    if args.lowered:
        raise UsageError("--lowered is for PT2E plans: torchao's quantize_ model is not lowered")
    return goal, [f.name for f in checked.formats]


def _show(args: argparse.Namespace) -> int:
    check_targets([args.html], [args.file])
    report = load_report(args.file)
    for line in check_verdict_gates(args.fail_on, [r.detector for r in report.results]):
        note(line)
    return _finish(report, args)


def _merge(args: argparse.Namespace) -> int:
    from qinsight.pipeline import merge_reports

    check_targets([args.out, args.html], args.files)
    report = merge_reports([load_report(path) for path in args.files])
    for line in check_verdict_gates(args.fail_on, [r.detector for r in report.results]):
        note(line)
    return _finish(report, args)


def _finish(report: Report, args: argparse.Namespace, *, writes: bool = True) -> int:
    """Prints ``report``, writes its files (not on a rank that only helped) and judges the gates."""
    write(render_text(report, everything=getattr(args, "all", False)))
    if getattr(args, "out", None) and writes:
        save_report(report, args.out)
        wrote(args.out)
    if args.html and writes:
        from qinsight.outputs.html import save_html

        save_html(report, args.html)
        wrote(args.html)
    gates = getattr(args, "fail_on", [])  # compare has no findings to gate on
    if gates and report.failures:
        failed = "; ".join(f"{f.detector} failed at {f.stage.value}: {f.error}" for f in report.failures)
        raise UsageError(f"--fail-on cannot be judged: {failed}")
    tripped = tripped_findings(report, gates)
    for detector, finding in tripped:
        note(f"gate: {detector} {finding.fqn}: {finding.verdict}")
    not_verified = unverified(report, gates)
    for line in not_verified:
        note(f"gate: unverified: {line}")
    return 1 if tripped or not_verified else 0


def _diff(args: argparse.Namespace) -> int:
    gates = parse_diff_gates(args.fail_on)
    diff = diff_reports(load_report(args.before), load_report(args.after), rel_tol=args.rel_tol)
    write(diff.to_text())
    tripped = tripped_diff(diff, gates)
    for line in tripped:
        note(f"gate: {line}")
    return 1 if tripped else 0


def _plot(args: argparse.Namespace) -> int:
    from qinsight.outputs.view import ReportView

    view = ReportView.of(load_report(args.file))
    if args.feature is None:
        write("".join(f"{name}\n" for name in view.feature_names()))
        return 0
    if args.feature not in view.feature_names():
        raise UsageError(f"no feature {args.feature!r}; features: {', '.join(view.feature_names())}")
    if not args.out:
        raise UsageError("--feature needs --out FILE.png")
    check_targets([args.out], [args.file])
    from qinsight.outputs.plots import plot_channels, plot_feature, plot_histogram

    if args.hist:
        figure = plot_histogram(view, args.feature, args.module)
    elif args.module:
        figure = plot_channels(view, args.module, args.feature)
    else:
        figure = plot_feature(view, args.feature)
    image = io.BytesIO()
    figure.savefig(image, format=Path(args.out).suffix.lstrip(".") or "png")
    write_atomically(args.out, image.getvalue())
    wrote(args.out)
    return 0


def _detectors() -> int:
    for entry in installed(DETECTORS):
        try:
            load_detector_class(entry.name)
            status = "ok"
        except PluginLoadError as exc:
            status = f"FAILED: {exc.reason}"
        opt_in = "  (opt-in: --detectors)" if entry.name in OPT_IN_IDS else ""
        write(f"{entry.name:<28} {entry.distribution} {entry.version}  {status}{opt_in}\n")
    return 0


def _schema() -> int:
    write(json.dumps(schema(), indent=1) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    commands: dict[str, Callable[[], int]] = {
        "diagnose": lambda: _diagnose(args),
        "compare": lambda: _compare(args),
        "plan": lambda: _plan(args),
        "merge": lambda: _merge(args),
        "show": lambda: _show(args),
        "diff": lambda: _diff(args),
        "plot": lambda: _plot(args),
        "detectors": _detectors,
        "schema": _schema,
    }
    return commands[args.command]()
