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
