"""The ``qinsight`` command.

Exit codes: 0 fine; 1 a ``--fail-on`` gate tripped; 2 usage, file or other
qinsight error (one line on stderr, no traceback unless ``--debug``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence, Sized

from torch import nn

from qinsight.diff import diff_reports
from qinsight.errors import QinsightError
from qinsight.examples import EXAMPLES, example
from qinsight.pipeline import diagnose
from qinsight.errors import PluginLoadError
from qinsight.plugins import installed_detectors, load_detector_class
from qinsight.report import Report
from qinsight.serde import load_report, schema

ACTIONABLE = "actionable"  # --fail-on value matching every finding that asks for action


class UsageError(QinsightError):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qinsight", description="Quantization diagnostics for PyTorch models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("diagnose", help="diagnose a model and print the report")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=sorted(EXAMPLES), help="a built-in example model")
    source.add_argument("--model", metavar="PKG.MOD:FACTORY", help="a function returning the model")
    run.add_argument("--data", metavar="PKG.MOD:FACTORY", help="with --model: a function returning the batches")
    run.add_argument("--batches", type=int, default=8, help="calibration batches of an example (default 8)")
    run.add_argument("--backend", default="x86", help="quantized backend (default x86)")
    run.add_argument("--detectors", help="comma-separated detector ids (default: QINSIGHT_DETECTORS or the built-ins)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    _outputs(run)

    show = commands.add_parser("show", help="print a saved report")
    show.add_argument("file")
    _outputs(show, save=False)

    diff = commands.add_parser("diff", help="what changed between two saved reports")
    diff.add_argument("before")
    diff.add_argument("after")
    diff.add_argument("--rel-tol", type=float, default=0.05, help="relative change that counts (default 0.05)")

    plot = commands.add_parser("plot", help="plot a feature of a saved report")
    plot.add_argument("file")
    plot.add_argument("--feature", required=True)
    plot.add_argument("--module", help="plot this module's channels (a histogram with --hist)")
    plot.add_argument("--hist", action="store_true", help="a histogram instead of a line")
    plot.add_argument("--out", required=True, metavar="X.png")

    commands.add_parser("detectors", help="installed detectors, their versions and load failures")
    commands.add_parser("schema", help="print the report file schema (for the snapshot test)")
    return parser


def _outputs(command: argparse.ArgumentParser, save: bool = True) -> None:
    if save:
        command.add_argument("--out", metavar="FILE.json", help="write the report file")
    command.add_argument("--html", metavar="FILE.html", help="write the report as a self-contained page")
    command.add_argument(
        "--fail-on", action="append", default=[], metavar="VERDICT",
        help=f"exit 1 if a finding has this verdict ('{ACTIONABLE}': any finding to act on); repeatable",
    )


def _load(target: str, what: str) -> Callable[[], object]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{what} must look like package.module:factory, not {target!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load {what} {target}: {type(exc).__name__}: {exc}") from exc
    if not callable(factory):
        raise UsageError(f"{what} {target} is not callable")
    return factory  # type: ignore[no-any-return]


class _Progress:
    """One line on stderr: batches done, rate, and an ETA when the number of batches is known."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.start = time.perf_counter()

    def __call__(self, done: int) -> None:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = done / elapsed
        of = f"/{self.total}" if self.total else ""
        eta = f", ETA {max(self.total - done, 0) / rate:.0f}s" if self.total else ""
        end = "\n" if done == self.total else ""
        print(f"\rcalibrating: {done}{of} batches, {rate:.1f} batch/s{eta}", end=end, file=sys.stderr, flush=True)


def _diagnose(args: argparse.Namespace) -> Report:
    model: object
    data: object
    if args.example:
        if args.batches < 1:
            raise UsageError("--batches must be at least 1")
        chosen = example(args.example)
        model, data, name = chosen.model(), chosen.data(args.batches), chosen.name
    else:
        if not args.data:
            raise UsageError("--model needs --data (a function returning the calibration batches)")
        model, data = _load(args.model, "--model")(), _load(args.data, "--data")()
        name = args.model.rpartition(":")[2]
    if not isinstance(model, nn.Module):
        raise UsageError(f"--model gave {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(data, Iterable):
        raise UsageError(f"--data gave {type(data).__name__}, not an iterable of batches")
    total = len(data) if isinstance(data, Sized) else None
    detectors = [d.strip() for d in args.detectors.split(",") if d.strip()] if args.detectors else None
    progress = None if args.quiet else _Progress(total)
    return diagnose(model, data, backend=args.backend, model_name=name, detectors=detectors, progress=progress)


def _finish(report: Report, args: argparse.Namespace) -> int:
    sys.stdout.write(report.to_text())
    if getattr(args, "out", None):
        report.save(args.out)
    if args.html:
        from qinsight.html import save_html

        save_html(report, args.html)
    tripped = [
        (result.detector, finding)
        for result in report.results
        for finding in result.findings
        if finding.verdict in args.fail_on or (ACTIONABLE in args.fail_on and finding.actionable)
    ]
    for detector, finding in tripped:
        print(f"qinsight: gate: {detector} {finding.fqn}: {finding.verdict}", file=sys.stderr)
    return 1 if tripped else 0


def _detectors() -> int:
    for entry in installed_detectors():
        try:
            load_detector_class(entry.id)
            status = "ok"
        except PluginLoadError as exc:
            status = f"FAILED: {exc.reason}"
        print(f"{entry.id:<28} {entry.distribution} {entry.version}  {status}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from qinsight.plots import plot_channels, plot_feature, plot_histogram
    from qinsight.view import ReportView

    view = ReportView.of(load_report(args.file))
    if args.feature not in view.feature_names():
        raise UsageError(f"no feature {args.feature!r}; features: {', '.join(view.feature_names())}")
    if args.hist:
        figure = plot_histogram(view, args.feature, args.module)
    elif args.module:
        figure = plot_channels(view, args.module, args.feature)
    else:
        figure = plot_feature(view, args.feature)
    figure.savefig(args.out)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "diagnose":
        return _finish(_diagnose(args), args)
    if args.command == "show":
        return _finish(load_report(args.file), args)
    if args.command == "diff":
        sys.stdout.write(diff_reports(load_report(args.before), load_report(args.after), rel_tol=args.rel_tol).to_text())
        return 0
    if args.command == "plot":
        return _plot(args)
    if args.command == "detectors":
        return _detectors()
    print(json.dumps(schema(), indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (QinsightError, ValueError, KeyError, OSError) as exc:
        if args.debug:
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"qinsight: error: {message}", file=sys.stderr)
        return 2
