"""The ``qinsight`` command.

Exit codes: 0 fine, 2 usage error, file error or other qinsight error (one
line on stderr, no traceback unless ``--debug``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from qinsight.diff import diff_reports
from qinsight.errors import QinsightError
from qinsight.examples import EXAMPLES, example
from qinsight.pipeline import diagnose
from qinsight.serde import load_report, schema


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qinsight", description="Quantization diagnostics for PyTorch models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("diagnose", help="diagnose a model and print the report")
    run.add_argument("--example", required=True, choices=sorted(EXAMPLES), help="a built-in example model")
    run.add_argument("--batches", type=int, default=8, help="calibration batches (default 8)")
    run.add_argument("--backend", default="x86", help="quantized backend (default x86)")
    run.add_argument("--out", metavar="FILE.json", help="also write the report file")
    show = commands.add_parser("show", help="print a saved report")
    show.add_argument("file")
    diff = commands.add_parser("diff", help="what changed between two saved reports")
    diff.add_argument("before")
    diff.add_argument("after")
    diff.add_argument("--rel-tol", type=float, default=0.05, help="relative change that counts (default 0.05)")
    commands.add_parser("schema", help="print the report file schema (for the snapshot test)")
    return parser


def _diagnose(args: argparse.Namespace) -> int:
    if args.batches < 1:
        raise QinsightError("--batches must be at least 1")
    chosen = example(args.example)
    report = diagnose(chosen.model(), chosen.data(args.batches), backend=args.backend, model_name=chosen.name)
    sys.stdout.write(report.to_text())
    if args.out:
        report.save(args.out)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "diagnose":
        return _diagnose(args)
    if args.command == "show":
        sys.stdout.write(load_report(args.file).to_text())
        return 0
    if args.command == "diff":
        changes = diff_reports(load_report(args.before), load_report(args.after), rel_tol=args.rel_tol)
        sys.stdout.write(changes.to_text())
        return 0
    print(json.dumps(schema(), indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (QinsightError, ValueError) as exc:
        if args.debug:
            raise
        print(f"qinsight: error: {exc}", file=sys.stderr)
        return 2
