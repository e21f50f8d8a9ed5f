"""The ``qinsight`` command.

Exit codes: 0 fine, 2 usage error or a qinsight error (one line on stderr,
no traceback unless ``--debug``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qinsight.errors import QinsightError
from qinsight.examples import EXAMPLES, example
from qinsight.pipeline import diagnose


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qinsight", description="Quantization diagnostics for PyTorch models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("diagnose", help="diagnose a model and print the report")
    run.add_argument("--example", required=True, choices=sorted(EXAMPLES), help="a built-in example model")
    run.add_argument("--batches", type=int, default=8, help="calibration batches (default 8)")
    run.add_argument("--backend", default="x86", help="quantized backend (default x86)")
    return parser


def _diagnose(args: argparse.Namespace) -> int:
    if args.batches < 1:
        raise QinsightError("--batches must be at least 1")
    chosen = example(args.example)
    report = diagnose(chosen.model(), chosen.data(args.batches), backend=args.backend, model_name=chosen.name)
    sys.stdout.write(report.to_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _diagnose(args)
    except (QinsightError, ValueError) as exc:
        if args.debug:
            raise
        print(f"qinsight: error: {exc}", file=sys.stderr)
        return 2
