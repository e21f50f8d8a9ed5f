"""Names of the modules of repeated blocks by their role: an LLM's 30 decoder layers read as one row
per role (``layers.*.mlp.down_proj (30)``), in the text report and the format plan's tables."""

from __future__ import annotations

from collections.abc import Sequence

# A section with more rows than this shows the modules of repeated blocks (an LLM's 30 decoder layers)
# one row per role, ``layers.*.mlp.down_proj (30)``; ``--all`` shows every module's row.
GROUP_ABOVE = 12


def role_of(fqn: str) -> str:
    """A module's place in a repeated block: ``layers.11.mlp.down_proj`` -> ``layers.*.mlp.down_proj``
    (a name with no index, or nothing but indices, is its own)."""
    parts = fqn.split(".")
    if not any(part.isdigit() for part in parts) or all(part.isdigit() for part in parts):
        return fqn
    return ".".join("*" if part.isdigit() else part for part in parts)


def by_role(rows: Sequence[tuple[str, str]], *, everything: bool, same_text: bool) -> list[tuple[str, str]]:
    """(module, text) rows as printed: each module's own in a short section or with ``everything``; else
    one row per role (and per text, where ``same_text``: a config's entries) naming how many modules
    share it; where texts differ (a finding's numbers), the first module's stands for them."""
    if everything or len(rows) <= GROUP_ABOVE:
        return list(rows)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for fqn, text in rows:
        groups.setdefault((role_of(fqn), text if same_text else ""), []).append((fqn, text))
    shown = []
    for (role, _), members in groups.items():
        if len(members) == 1:
            shown.append(members[0])
        elif same_text:
            shown.append((f"{role} ({len(members)})", members[0][1]))
        else:
            first, text = members[0]
            shown.append((f"{role} ({len(members)})", f"{first}: {text}; {len(members) - 1} more like it (--all lists them)"))
    return shown


__all__ = ["GROUP_ABOVE", "by_role", "role_of"]
