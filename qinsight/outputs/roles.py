"""Names of the modules of repeated blocks by their role: an LLM's 30 decoder layers read as one row
per role (``layers.*.mlp.down_proj (30)``), in the text report and the format plan's tables."""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen
class Layout:
    """How much of a long section the report's text shows. The default keeps an LLM's report to one
    screen; :meth:`full` (``--all``) shows every module's row."""

    names: int = 8  # modules named on a summary line before "and N more"
    # A section with more rows than this shows the modules of repeated blocks (an LLM's 30 decoder
    # layers) one row per role, ``layers.*.mlp.down_proj (30)``.
    group_above: int = 12
    role_rows: int = 8  # a verdict's rows shown before "N more roles"

    @classmethod
    def full(cls) -> Layout:
        """Every module named, every row shown: limits no section reaches."""
        return cls(names=sys.maxsize, group_above=sys.maxsize, role_rows=sys.maxsize)

    def short(self, rows: int) -> bool:
        """Whether a section of ``rows`` rows shows each module's own row."""
        return rows <= self.group_above


def role_of(fqn: str) -> str:
    """A module's place in a repeated block: ``layers.11.mlp.down_proj`` -> ``layers.*.mlp.down_proj``
    (a name with no index, or nothing but indices, is its own)."""
    parts = fqn.split(".")
    if not any(part.isdigit() for part in parts) or all(part.isdigit() for part in parts):
        return fqn
    return ".".join("*" if part.isdigit() else part for part in parts)


def by_role(
    rows: Sequence[tuple[str, str]],
    layout: Layout,
    *,
    same_text: bool,
    severity: Mapping[str, float] | None = None,
) -> list[tuple[str, str]]:
    """(module, text) rows as printed: each module's own in a section the ``layout`` calls short; else
    one row per role naming how many modules share it. Where ``same_text`` (a config's entries), the
    text most of them share, and how many say otherwise; else (a finding's numbers) the worst module's
    by ``severity`` (higher worse; the first where none is known) stands for them, the next two named.
    Where more rows result than :func:`capped` shows, the roles with the worst module come first."""
    if layout.short(len(rows)):
        shown = [(role_of(fqn), (fqn, text)) for fqn, text in rows]
    else:
        groups: dict[str, list[tuple[str, str]]] = {}
        for fqn, text in rows:
            groups.setdefault(role_of(fqn), []).append((fqn, text))
        shown = [(role, _role_row(role, members, same_text, severity or {})) for role, members in groups.items()]
    if severity and len(shown) > layout.role_rows + 1:
        worst: dict[str, float] = {}
        for fqn, value in severity.items():
            worst[role_of(fqn)] = max(value, worst.get(role_of(fqn), -math.inf))
        shown.sort(key=lambda item: -worst.get(item[0], -math.inf))
    return [row for _, row in shown]


def _role_row(
    role: str, members: Sequence[tuple[str, str]], same_text: bool, severity: Mapping[str, float]
) -> tuple[str, str]:
    if len(members) == 1:
        return members[0]
    return (f"{role} ({len(members)})", _most_said(members) if same_text else _worst_first(members, severity))


def _worst_first(members: Sequence[tuple[str, str]], severity: Mapping[str, float]) -> str:
    """The worst member's text, the next two worst named, the rest counted."""
    ranked = sorted(members, key=lambda member: -severity.get(member[0], -math.inf)) if severity else list(members)
    (worst, text), named = ranked[0], [fqn for fqn, _ in ranked[1:3]]
    rest = len(members) - 1 - len(named)
    if not severity:
        return f"{worst}: {text}; {len(members) - 1} more like it (--all lists them)"
    return f"worst {worst}: {text}; next {', '.join(named)}" + (f"; {rest} more (--all lists them)" if rest else "")


def _most_said(members: Sequence[tuple[str, str]]) -> str:
    """The text most ``members`` share; the others' counted after it ("; 2 of them: ...")."""
    counts = collections.Counter(text for _, text in members)
    (most, _), *others = counts.most_common()
    return "; ".join([most, *(f"{count} of them: {text}" for text, count in others)])


def role_counts(fqns: Sequence[str]) -> str:
    """Modules named by role with their counts, in first-seen order: ``mul#0, layers.*.add#0 (28)``."""
    counts = collections.Counter(role_of(fqn) for fqn in fqns)
    return ", ".join(role if count == 1 else f"{role} ({count})" for role, count in counts.items())


def capped(rows: Sequence[tuple[str, str]], layout: Layout) -> tuple[list[tuple[str, str]], int]:
    """At most the ``layout``'s ``role_rows`` rows (one more rather than a "1 more" line), and how many
    were left out."""
    if len(rows) <= layout.role_rows + 1:
        return list(rows), 0
    return list(rows[: layout.role_rows]), len(rows) - layout.role_rows


__all__ = ["Layout", "by_role", "capped", "role_counts", "role_of"]
