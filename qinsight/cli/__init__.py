"""The ``qinsight`` command: its arguments and its one error boundary.

Exit codes: 0 fine; 1 a ``--fail-on`` gate tripped; 2 anything else that went
wrong, as one line on stderr (``--debug`` shows the traceback); 130 Ctrl-C.
Commands that only read files (``show``, ``diff``, ``plot``, ``schema``) do
not import torch.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Sequence

from qinsight._version import __version__
from qinsight.cli.gates import ACTIONABLE, UNVERIFIED
from qinsight.cli.output import error_line
from qinsight.core.backend import backend_names
from qinsight.core.errors import QinsightError
from qinsight.core.sites import FLOWS

EXAMPLE_NAMES = ("cnn", "encoder", "resnet18")  # qinsight.examples.EXAMPLES, named here so --help needs no torch


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error (``--help`` shows the usage)."""

    def error(self, message: str) -> typing.NoReturn:
        error_line(f"{message} (see {self.prog} --help)")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qinsight", description="Quantization diagnostics for PyTorch models.")
    parser.add_argument("--version", action="version", version=f"qinsight {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_diagnose_command, _compare_command, _plan_command, _file_commands):
        add(commands)
    return parser


def _diagnose_command(commands: typing.Any) -> None:
    """``qinsight diagnose``: the model, what it is judged against, verification, outputs."""
    run = commands.add_parser("diagnose", help="diagnose a model and print the report")
    _model_source(run)
    run.add_argument(
        "--backend",
        help=f"quantized backend: {', '.join(backend_names())} (default: the --qconfig quantizer's, else x86)",
    )
    _judged_against(run)
    run.add_argument("--detectors", help="comma-separated detector ids (default: QINSIGHT_DETECTORS or the built-ins)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.add_argument(
        "--verify",
        metavar="fx|pt2e|torchao|fx,pt2e",
        help="verify the report's config for real in these flows (default: QINSIGHT_VERIFY, else the model's own flow)",
    )
    run.add_argument(
        "--no-verify", action="store_true", help="do not quantize the config for real: the report says it is unverified"
    )
    run.add_argument(
        "--lowered", action="store_true", help="PT2E: verify each config as the program lowered for the backend"
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="calibrate only shard I of N (batches I, I+N, ...), numbered as in all the data, for 'qinsight merge'",
    )
    _outputs(run)


def _compare_command(commands: typing.Any) -> None:
    """``qinsight compare``: a model quantized in a flow, compared with the float one (and lowered)."""
    compare = commands.add_parser("compare", help="quantize a model and compare it with the float one, layer by layer")
    _model_source(compare)
    compare.add_argument(
        "--flow",
        choices=FLOWS,
        help="prepare_fx/convert_fx (the default), PT2E (the default with --backend xnnpack or --lowered) "
        "or torchao's quantize_ (int8 dynamic activations and weights)",
    )
    compare.add_argument(
        "--backend",
        default="x86",
        help=f"FX: the qconfig backend; PT2E: its quantizer; one of {', '.join(backend_names())} (default x86)",
    )
    compare.add_argument(
        "--lowered",
        action="store_true",
        help="PT2E: also lower the quantized model for the backend (xnnpack: ExecuTorch; x86: inductor) and measure "
        "what the program computes against the reference, per layer, and its latency and size",
    )
    compare.add_argument("--out", metavar="FILE.json", help="write the comparison as a report file")
    compare.add_argument("--html", metavar="FILE.html", help="write it as a self-contained page")


def _plan_command(commands: typing.Any) -> None:
    """``qinsight plan``: the evaluation data, the goal, the deployment, smoothing, outputs."""
    planned = commands.add_parser(
        "plan", help="find what to keep in float so that the quantized model reaches a target"
    )
    _model_source(planned)
    planned.add_argument(
        "--eval-data", metavar="PKG.MOD:FACTORY", help="with --model: a function returning the evaluation batches"
    )
    planned.add_argument(
        "--eval-batches", type=int, default=4, help="evaluation batches of an example or --hf text (default 4)"
    )
    planned.add_argument(
        "--eval-text",
        metavar="FILE",
        help="with --hf: evaluation text, one paragraph per line (default: qinsight's held-out paragraphs)",
    )
    planned.add_argument(
        "--flow",
        choices=FLOWS,
        help="prepare_fx/convert_fx (default), PT2E (the default with --backend xnnpack or --lowered), "
        "or torchao's quantize_ with a format per Linear (--formats)",
    )
    planned.add_argument(
        "--backend",
        default="x86",
        help=f"FX: the qconfig backend; PT2E: its quantizer; one of {', '.join(backend_names())} (default x86)",
    )
    planned.add_argument(
        "--lowered",
        action="store_true",
        help="PT2E: score each config for real as the program lowered for the backend "
        "(xnnpack: ExecuTorch; x86: inductor)",
    )
    _plan_goal_arguments(planned)
    planned.add_argument(
        "--smooth",
        action="store_true",
        help="smooth the Linears' inputs first (SmoothQuant factors, chosen by measured error)",
    )
    planned.add_argument(
        "--correct-biases",
        action="store_true",
        help="correct the default config's biases first where that scores better (every layer stays int8)",
    )
    _judged_against(planned)
    planned.add_argument("--quiet", action="store_true", help="no progress lines")
    _outputs(planned)


def _plan_goal_arguments(planned: argparse.ArgumentParser) -> None:
    """``qinsight plan``'s goal: the target, the formats of a format plan, the budget, the confidence,
    the program's speed."""
    planned.add_argument(
        "--target",
        help="sqnr>=DB, cosine>=X, top1>=X, kl<=NATS, token_agreement>=X, perplexity<=RATIO (logits), "
        "a plugin metric's NAME>=X or NAME<=X (default sqnr>=30 without a --budget)",
    )
    planned.add_argument(
        "--formats",
        default="int8,int4_g32",
        help="with --flow torchao: the formats to choose from (default int8,int4_g32)",
    )
    planned.add_argument(
        "--budget",
        metavar="float<=N|bits<=N",
        help="what the plan may spend: fx and pt2e float<=N (at most N sites in float, the best score within it, "
        "instead of a --target); --flow torchao bits<=N (the mean bits per weight, scales included)",
    )
    planned.add_argument(
        "--confidence",
        type=float,
        help="with --flow torchao and kl, token_agreement or perplexity: hold the target at the score's one-sided "
        "bound "
        "at this confidence over the search tokens (default 0.95; 0.5: at the score itself); with a top1 target: "
        "at Wilson's bound over the evaluation rows (default: at the score itself)",
    )
    planned.add_argument(
        "--speed",
        metavar="speedup>=X|latency<=MS",
        help="with --lowered: what the program must run at beside the target: speedup>=X (X times the float "
        "program's speed, lowered alike) or latency<=MS (milliseconds a batch)",
    )
    planned.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="fx and pt2e: what the plan's simulation may hold beyond one batch's values, e.g. 4GB (default 2GiB): "
        "more is faster, never another plan",
    )


def _file_commands(commands: typing.Any) -> None:
    """The commands on saved reports (merge, show, diff, plot) and on the installation (detectors, schema)."""
    merge = commands.add_parser("merge", help="merge reports of one model calibrated on disjoint data into one")
    merge.add_argument("files", nargs="+", metavar="REPORT.json")
    _outputs(merge)

    show = commands.add_parser("show", help="print a saved report")
    show.add_argument("file")
    _outputs(show, save=False)

    diff = commands.add_parser("diff", help="what changed between two saved reports")
    diff.add_argument("before")
    diff.add_argument("after")
    diff.add_argument("--rel-tol", type=float, default=0.05, help="relative change that counts (default 0.05)")
    diff.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="GATE",
        help="exit 1 on: 'any' difference, a 'verdict' change, a finding becoming 'actionable', "
        "or 'sqnr-drop=DB' (a layer's SQNR falling by more than DB); repeatable",
    )

    plot = commands.add_parser("plot", help="plot a feature of a saved report (without --feature: list the features)")
    plot.add_argument("file")
    plot.add_argument("--feature")
    plot.add_argument("--module", help="plot this module's channels (a histogram with --hist)")
    plot.add_argument("--hist", action="store_true", help="a histogram instead of a line")
    plot.add_argument("--out", metavar="X.png")

    commands.add_parser("detectors", help="installed detectors, their versions and load failures")
    commands.add_parser("schema", help="print the report file schema (for the snapshot test)")


def _model_source(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=EXAMPLE_NAMES, help="a built-in example model")
    source.add_argument(
        "--model",
        metavar="PKG.MOD:FACTORY",
        help="a function returning the model (modules in the current folder are found)",
    )
    source.add_argument(
        "--hf",
        metavar="FOLDER|FILE.gguf",
        help="a Hugging Face causal LM, loaded offline with transformers (the hf extra)",
    )
    command.add_argument("--data", metavar="PKG.MOD:FACTORY", help="with --model: a function returning the batches")
    command.add_argument(
        "--batches", type=int, default=8, help="calibration batches of an example or --hf text (default 8)"
    )
    command.add_argument(
        "--text", metavar="FILE", help="with --hf: calibration text, one paragraph per line (default: qinsight's own)"
    )
    command.add_argument("--tokens", type=int, default=64, help="with --hf: tokens per paragraph at most (default 64)")


def _judged_against(command: argparse.ArgumentParser) -> None:
    """``--qconfig``: one default for every command that diagnoses, so one model gets one verdict."""
    command.add_argument(
        "--qconfig",
        default="default",
        metavar="default|none|PKG.MOD:FACTORY",
        help="the plan the findings are judged against: the backend's default config (default: FX's QConfigMapping; "
        "XNNPACKQuantizer for xnnpack), none, or a function returning your QConfigMapping or PT2E Quantizer",
    )


def _outputs(command: argparse.ArgumentParser, save: bool = True) -> None:
    if save:
        command.add_argument("--out", metavar="FILE.json", help="write the report file")
    command.add_argument("--html", metavar="FILE.html", help="write the report as a self-contained page")
    command.add_argument("--all", action="store_true", help="name every module (not the first few per verdict)")
    command.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="VERDICT",
        help=f"exit 1 if a finding has this verdict ('{ACTIONABLE}': any finding to act on; "
        f"'{UNVERIFIED}': the config not verified for real); repeatable",
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, QinsightError):
        return str(exc)
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # argparse itself exits 2 on bad usage, 0 on --help and --version
    from qinsight.cli.commands import run

    try:
        return run(args)
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except SystemExit as exc:  # sys.exit in a --model/--data factory or a plugin: not ours to exit with
        if args.debug:
            raise
        error_line(f"something the command ran called sys.exit({exc.code!r})")
        return 2
    except Exception as exc:
        if args.debug:
            raise
        error_line(_describe(exc))
        return 2
