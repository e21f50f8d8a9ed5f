"""The base of every detector's Finding: one verdict on one module.

Each detector declares its own frozen Finding subclass with the numbers that
led to its verdict. The base fixes what every finding can answer, so text,
HTML and diffs can treat findings of detectors they have never seen alike.
"""

from __future__ import annotations

from typing import ClassVar

import attrs


@attrs.frozen(kw_only=True)
class Finding:
    """A detector's verdict on the module ``fqn``.

    ``verdicts`` lists every verdict the class can give, so a gate such as
    ``qinsight diagnose --fail-on VERDICT`` can refuse a verdict no detector
    gives (a typo would otherwise never trip). Empty means not declared.
    """

    verdicts: ClassVar[tuple[str, ...]] = ()

    fqn: str

    @property
    def verdict(self) -> str:
        """A short label shared by findings with the same conclusion."""
        raise NotImplementedError(f"{type(self).__name__} must define verdict")

    @property
    def actionable(self) -> bool:
        """Whether the user should change something for this module."""
        raise NotImplementedError(f"{type(self).__name__} must define actionable")

    def reason(self) -> str:
        """One line with the numbers behind the verdict."""
        raise NotImplementedError(f"{type(self).__name__} must define reason()")

    def severity(self) -> float | None:
        """How bad it is, higher worse, comparable between findings of one verdict: the text names the
        worst modules of a repeated block's role first. ``None`` (the default): no order."""
        return None


def check_finding(finding: object) -> None:
    """``TypeError`` unless ``finding`` is a Finding that can say its verdict, whether it is actionable and why.

    Checked where findings enter a report (a plugin's result, a report file),
    so a bad one fails there and not later in the text, the file or the page.
    """
    if not isinstance(finding, Finding):
        raise TypeError(f"a finding is {type(finding).__name__}, not a qinsight Finding")
    try:
        answers = (finding.verdict, finding.actionable, finding.reason())
    except Exception as exc:
        raise TypeError(
            f"its finding for {finding.fqn!r} cannot say its verdict or reason: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(answers[0], str) and isinstance(answers[1], bool) and isinstance(answers[2], str)):
        raise TypeError(
            f"its finding for {finding.fqn!r} gives verdict, actionable, reason() of types "
            f"{', '.join(type(a).__name__ for a in answers)}, not str, bool, str"
        )
