"""The records whose form in report files changed, read in every form a readable schema wrote them in.

A file of an earlier minor or major version reads as if it had been written now: what it lacks is taken
from what it said. Each hook here is the one place its old form is read.
"""

from __future__ import annotations

from typing import Final, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn

from qinsight.core.notes import Note, NoteKind
from qinsight.core.plan import Budget, SuggestionCheck, Target
from qinsight.core.verification import KindCheck, SuggestionKind


def register_changed_records(converter: cattrs.Converter, *, strict: bool) -> None:
    """Structure hooks for notes (4.0), budgets (4.0), a plan's checks (3.8, 4.1) and a verification's
    (4.1) on ``converter``."""
    _notes(converter, strict=strict)
    _goals(converter, strict=strict)
    _checks(converter, strict=strict)
    _kind_checks(converter, strict=strict)


def _notes(converter: cattrs.Converter, *, strict: bool) -> None:
    """A note is its kind and its text; a file before 4.0 wrote the text alone (its kind: ``other``)."""
    structure = make_dict_structure_fn(Note, converter, _cattrs_forbid_extra_keys=strict)

    def note_in(data: object, _: object) -> Note:
        if isinstance(data, str):  # before 4.0
            return Note(NoteKind.OTHER, data)
        if not isinstance(data, dict):
            raise TypeError("a note must be an object or, before 4.0, a string")
        return structure(data, Note)

    converter.register_structure_hook(Note, note_in)


def _goals(converter: cattrs.Converter, *, strict: bool) -> None:
    """A plan's target is a :class:`Target` or a :class:`Budget`, told apart by their fields. Files before
    4.0 wrote a sites budget as the target ``float<=N`` and a bits budget as ``{"bits": N}``."""
    target = make_dict_structure_fn(Target, converter, _cattrs_forbid_extra_keys=strict)
    budget = make_dict_structure_fn(Budget, converter, _cattrs_forbid_extra_keys=strict)

    def budget_in(data: object, _: object) -> Budget:
        if not isinstance(data, dict):
            raise TypeError("a budget must be an object")
        if set(data) == {"bits"}:  # before 4.0
            return budget({"unit": "bits", "limit": data["bits"]}, Budget)
        return budget(data, Budget)

    def goal_in(data: object, _: object) -> Target | Budget:
        if not isinstance(data, dict):
            raise TypeError("a plan's target must be an object")
        if "unit" in data:
            return budget(data, Budget)
        if data.get("metric") == "float":  # before 4.0: at most N sites in float
            return Budget(unit="float", limit=converter.structure(data.get("threshold"), float))
        return target(data, Target)

    converter.register_structure_hook(Budget, budget_in)
    converter.register_structure_hook(Target | Budget, goal_in)


# What a check of schema 3.7 or earlier said, read back as its kinds: the words QuantSuggestion.describe
# and FxActivations.describe wrote then. The one place a change's words are read, for those files only.
_SAID: Final = {
    "keep in float": SuggestionKind.KEEP_FLOAT,
    "activation dynamic": SuggestionKind.DYNAMIC,
    "weight per_tensor": SuggestionKind.PER_TENSOR,
    "equalize": SuggestionKind.EQUALIZE,
}


def _checks(converter: cattrs.Converter, *, strict: bool) -> None:
    structure = make_dict_structure_fn(SuggestionCheck, converter, _cattrs_forbid_extra_keys=strict)

    def check_in(data: object, _: object) -> SuggestionCheck:
        if not isinstance(data, dict):
            raise TypeError("a suggestion check must be an object")
        check = _why_of_old(data, structure(data, SuggestionCheck))
        if "kinds" in data:
            return check
        if check.fqn == "(activations)":  # 3.7 named the activation observing check so
            return attrs.evolve(check, fqn="", kinds=(SuggestionKind.ACTIVATIONS,))
        said = check.change.split(", ")
        return attrs.evolve(check, kinds=tuple(kind for words, kind in _SAID.items() if words in said))

    converter.register_structure_hook(SuggestionCheck, check_in)


def _kind_checks(converter: cattrs.Converter, *, strict: bool) -> None:
    structure = make_dict_structure_fn(KindCheck, converter, _cattrs_forbid_extra_keys=strict)

    def check_in(data: object, _: object) -> KindCheck:
        if not isinstance(data, dict):
            raise TypeError("a verification's check must be an object")
        return _why_of_old(data, structure(data, KindCheck))

    converter.register_structure_hook(KindCheck, check_in)


_Check = TypeVar("_Check", SuggestionCheck, KindCheck)


def _why_of_old(data: dict[str, object], check: _Check) -> _Check:
    """A check's reason before 4.1 was its words alone: its kind is ``other``."""
    return attrs.evolve(check, why=NoteKind.OTHER) if "why" not in data and check.reason else check


__all__ = ["register_changed_records"]
