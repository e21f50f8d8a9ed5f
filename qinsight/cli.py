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
import warnings
from collections.abc import Callable, Iterable, Sequence, Sized

from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping

from qinsight.compare import compare_activations, compare_weights, quantize_candidates
from qinsight.core.comparison import Comparison
from qinsight.core.errors import PluginLoadError, QinsightError, UsageError
from qinsight.core.report import Report
from qinsight.examples import EXAMPLES, example
from qinsight.frontends import model_structure
from qinsight.outputs.diff import diff_reports
from qinsight.outputs.serde import load_report, schema
from qinsight.pipeline import comparison_report, diagnose
from qinsight.plugin.discovery import installed_detectors, load_detector_class

ACTIONABLE = "actionable"  # --fail-on value matching every finding that asks for action


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qinsight", description="Quantization diagnostics for PyTorch models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("diagnose", help="diagnose a model and print the report")
    _model_source(run)
    run.add_argument("--backend", default="x86", help="quantized backend (default x86)")
    run.add_argument("--detectors", help="comma-separated detector ids (default: QINSIGHT_DETECTORS or the built-ins)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    _outputs(run)

    compare = commands.add_parser("compare", help="quantize a model and compare it with the float one, layer by layer")
    _model_source(compare)
    compare.add_argument("--flow", choices=("fx", "pt2e"), default="fx", help="prepare_fx/convert_fx (default) or PT2E")
    compare.add_argument("--backend", default="x86", help="FX qconfig backend (default x86; PT2E quantizes for x86)")
    compare.add_argument("--out", metavar="FILE.json", help="write the comparison as a report file")
    compare.add_argument("--html", metavar="FILE.html", help="write it as a self-contained page")

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


def _model_source(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=sorted(EXAMPLES), help="a built-in example model")
    source.add_argument("--model", metavar="PKG.MOD:FACTORY", help="a function returning the model")
    command.add_argument("--data", metavar="PKG.MOD:FACTORY", help="with --model: a function returning the batches")
    command.add_argument("--batches", type=int, default=8, help="calibration batches of an example (default 8)")


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


def _model_and_data(args: argparse.Namespace) -> tuple[nn.Module, Iterable[object], str]:
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
    return model, data, name


def _diagnose(args: argparse.Namespace) -> Report:
    model, data, name = _model_and_data(args)
    total = len(data) if isinstance(data, Sized) else None
    detectors = [d.strip() for d in args.detectors.split(",") if d.strip()] if args.detectors else None
    progress = None if args.quiet else _Progress(total)
    return diagnose(model, data, backend=args.backend, model_name=name, detectors=detectors, progress=progress)


def _quantizer(flow: str, backend: str) -> object:
    """torch's default config for ``flow``: a QConfigMapping for FX, X86InductorQuantizer for PT2E."""
    if flow == "fx":
        return get_default_qconfig_mapping(backend)
    if backend != "x86":
        raise UsageError(f"--flow pt2e quantizes for x86 (X86InductorQuantizer), not {backend}")
    from qinsight.outputs.pt2e import (
        default_x86_quantizer,  # torchao only for this flow
    )

    return default_x86_quantizer()


def _compare(args: argparse.Namespace) -> int:
    """Quantizes the model with torch's default for the flow, calibrated on the batches, and
    compares it with the float model on the same batches."""
    model, data, name = _model_and_data(args)
    batches = list(data)  # calibration, then comparison
    if not batches:
        raise UsageError("no batches to calibrate and compare on")
    config = _quantizer(args.flow, args.backend)
    with warnings.catch_warnings():  # torch's and torchao's deprecation notices: nothing the user can act on
        warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|torchao)(\.|$)")
        quantized = quantize_candidates(model, {args.flow: config}, batches)[args.flow]
        structure = model_structure(model)  # one trace for both comparisons
        comparison = Comparison(
            quantized=f"convert_{args.flow} ({'x86' if args.flow == 'pt2e' else args.backend} default)",
            weights=compare_weights(model, quantized, structure=structure),
            activations=compare_activations(model, quantized, batches, structure=structure),
        )
    return _finish(comparison_report(comparison, model_name=name), args)


def _finish(report: Report, args: argparse.Namespace) -> int:
    sys.stdout.write(report.to_text())
    if getattr(args, "out", None):
        report.save(args.out)
    if args.html:
        from qinsight.outputs.html import save_html

        save_html(report, args.html)
    gates = getattr(args, "fail_on", [])  # compare has no findings to gate on
    tripped = [
        (result.detector, finding)
        for result in report.results
        for finding in result.findings
        if finding.verdict in gates or (ACTIONABLE in gates and finding.actionable)
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
    from qinsight.outputs.plots import plot_channels, plot_feature, plot_histogram
    from qinsight.outputs.view import ReportView

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
    if args.command == "compare":
        return _compare(args)
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
