"""A typed program over qinsight: the records from ``qinsight.types``, the errors from ``qinsight.errors``.

It diagnoses the built-in CNN, lists the layers the report would quantize per channel and those it
keeps in float, and shows the one-line error a mistaken argument ends in. CI checks it with
``mypy --strict`` and runs it. Run: python examples/typed_program.py
"""

from __future__ import annotations

import warnings

import qinsight
from qinsight.errors import InvalidParameterError
from qinsight.examples import example
from qinsight.types import ConfigVerification, QuantSuggestion, Report, WeightScheme

warnings.filterwarnings("ignore")


def per_channel(suggestions: tuple[QuantSuggestion, ...]) -> list[str]:
    """The layers a report suggests per-channel weights for."""
    return [s.fqn for s in suggestions if s.weight is WeightScheme.PER_CHANNEL]


def verdicts(report: Report) -> list[str]:
    """Each flow's verdict on the report's config, one line each."""
    checked: tuple[ConfigVerification, ...] = report.verification
    return [v.describe() for v in checked]


def main() -> None:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    report = qinsight.diagnose(model, data, model_name=chosen.name)
    print("per-channel weights:", ", ".join(per_channel(report.suggestions)) or "none")
    print("\n".join(verdicts(report)))
    try:
        qinsight.plan(model, data[:4], data[4:], goal="top1>=1.5")
    except InvalidParameterError as error:  # one line naming what to change; its fields for programs
        print(f"refused: {error.name}={error.value!r} ({error.expected})")


if __name__ == "__main__":
    main()
