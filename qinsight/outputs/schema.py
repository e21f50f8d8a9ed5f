"""The report file's schema: every class and enum a file can hold, and which version bump a change needs.

``qinsight schema`` prints it; ``tests/data/report_schema.json`` is its snapshot
(docs/file-format.md has the versioning rules).
"""

from __future__ import annotations

import enum
import re
import typing
from typing import Any

import attrs

from qinsight.core.report import Report
from qinsight.outputs.serde import SCHEMA_VERSION
from qinsight.plugin.discovery import DEFAULT_IDS, finding_type


def _type_name(hint: object) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return re.sub(r"\b(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*)", r"\1", str(hint))


def schema() -> dict[str, Any]:
    """Every class and enum a report file can hold, with its fields' types: the file's schema."""
    described: dict[str, Any] = {}

    def visit(hint: object) -> None:
        for arg in typing.get_args(hint):
            visit(arg)
        if not isinstance(hint, type) or hint.__name__ in described:
            return
        if issubclass(hint, enum.Enum):
            described[hint.__name__] = {"values": [member.value for member in hint]}
        elif attrs.has(hint):
            attrs.resolve_types(hint)
            fields = attrs.fields(hint)
            described[hint.__name__] = {
                "fields": {f.name: {"type": _type_name(f.type), "required": f.default is attrs.NOTHING} for f in fields}
            }
            for f in fields:
                visit(f.type)

    visit(Report)
    for detector_id in DEFAULT_IDS:
        visit(finding_type(detector_id))
    return {"schema_version": list(SCHEMA_VERSION), "classes": dict(sorted(described.items()))}


def compatibility(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(breaking, compatible) changes from schema ``old`` to ``new`` (their "classes" parts).

    Breaking, needing a major bump: a class, field or enum value removed, a
    field's type changed, a field that became required or a new required field.
    Compatible, needing a minor bump: a new optional field, class or enum value, or
    a ``Literal`` field taking a new value (every old file still loads).
    """
    breaking: list[str] = []
    compatible: list[str] = []
    for name, was in old.items():
        now = new.get(name)
        if now is None:
            breaking.append(f"{name} removed")
            continue
        for value in set(was.get("values", [])) - set(now.get("values", [])):
            breaking.append(f"{name} value {value!r} removed")
        for value in set(now.get("values", [])) - set(was.get("values", [])):
            compatible.append(f"{name} value {value!r} added")
        old_fields, new_fields = was.get("fields", {}), now.get("fields", {})
        for field, spec in old_fields.items():
            if field not in new_fields:
                breaking.append(f"{name}.{field} removed")
            elif new_fields[field]["type"] != spec["type"]:
                was_values, now_values = _literal_values(spec["type"]), _literal_values(new_fields[field]["type"])
                if was_values and was_values <= now_values:
                    added = sorted(now_values - was_values)
                    compatible.extend(f"{name}.{field} value {value!r} added" for value in added)
                else:
                    breaking.append(f"{name}.{field} retyped {spec['type']} -> {new_fields[field]['type']}")
            elif new_fields[field]["required"] and not spec["required"]:
                breaking.append(f"{name}.{field} became required")
        for field, spec in new_fields.items():
            if field not in old_fields:
                (breaking if spec["required"] else compatible).append(
                    f"{name}.{field} added" + (" (required)" if spec["required"] else "")
                )
    compatible.extend(f"{name} added" for name in new if name not in old)
    return breaking, compatible


def _literal_values(described: str) -> set[str]:
    """The values of a ``Literal['a', 'b']`` type as the schema spells it; empty for any other type."""
    found = re.fullmatch(r"Literal\[(.*)\]", described)
    return set(re.findall(r"'([^']*)'", found.group(1))) if found else set()
