"""advice_of: which advice a report, a plan or a report carrying a plan gives for a flow, and what it
says where that advice was not made for the flow asked (notes, not silence)."""

from __future__ import annotations

import pickle

import pytest

import qinsight
from qinsight import Advice, QuantPlan, Report, advice_of
from qinsight.core.equalization import EqualizationEntry, EqualizationMapping
from qinsight.core.smoothing import SmoothingEntry, SmoothingMapping
from qinsight.types import NoteKind, QuantSuggestion, ReportMetadata, Target


def report(**fields: object) -> Report:
    metadata = ReportMetadata(model="m", frontend="fx", backend="x86", batches=1, qinsight_version="", torch_version="")
    return Report(
        metadata=metadata,
        sites=(),
        observations=(),
        results=(),
        suggestions=(QuantSuggestion(fqn="fc1", keep_float=True),),
        **fields,
    )  # type: ignore[arg-type]


def plan(flow: str, **fields: object) -> QuantPlan:
    return QuantPlan(
        flow=flow,
        backend="x86",
        metric="sqnr",
        target=Target.parse("sqnr>=30"),
        reached=True,
        default_score=20.0,
        verified_score=31.0,
        suggestions=(QuantSuggestion(fqn="fc2", keep_float=True),),
        **fields,  # type: ignore[arg-type]
    )


def test_a_report_gives_its_own_suggestions_and_pt2e_says_it_cannot_equalize() -> None:
    equalizing = report(equalization_mapping=EqualizationMapping(entries=(EqualizationEntry(fqn="fc1"),)))
    fx = advice_of(equalizing)
    assert (fx.flow, fx.source, fx.verified, fx.notes) == ("fx", "report", False, ())
    assert fx.suggestions == equalizing.suggestions and fx.equalization.fqns == ("fc1",)
    pt2e = advice_of(equalizing, "pt2e")
    assert pt2e.flow == "pt2e" and [(n.kind, "fc1" in n.text) for n in pt2e.notes] == [(NoteKind.UNEQUALIZED, True)]


def test_a_report_carrying_a_plan_gives_the_plan_for_its_flow_and_says_so_for_the_other() -> None:
    carrying = report(plan=plan("fx"))
    fx = advice_of(carrying, "fx")
    assert (fx.source, fx.verified, fx.suggestions, fx.notes) == (
        "plan",
        True,
        (QuantSuggestion(fqn="fc2", keep_float=True),),
        (),
    )
    pt2e = advice_of(carrying, "pt2e")
    assert pt2e.source == "report" and pt2e.suggestions == carrying.suggestions
    assert [note.kind for note in pt2e.notes] == [NoteKind.OTHER_FLOW]


def test_a_plan_is_its_own_flows_advice_and_unverified_in_the_other() -> None:
    smoothed = plan(
        "pt2e",
        smoothing=SmoothingMapping(
            entries=(SmoothingEntry(fqn="fc1", alpha=0.5, factors=(1.0, 2.0), sqnr_before=20.0, sqnr_after=25.0),)
        ),
    )
    own = advice_of(smoothed)
    assert own.flow == "pt2e" and own.verified and own.smoothing == smoothed.smoothing
    assert [note.kind for note in own.notes] == [NoteKind.SMOOTHED_MODEL]
    assert "qinsight.smoothed(model, plan)" in str(own.notes[0])  # the words name what to do
    other = advice_of(smoothed, "fx")
    assert other.flow == "fx" and not other.verified and other.notes[-1].kind is NoteKind.OTHER_FLOW
    assert advice_of(own) is own and isinstance(own, Advice)


def test_a_flow_qinsight_does_not_know_is_one_error_naming_the_choices() -> None:
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="flow='tflite' is invalid; expected 'fx' or 'pt2e' or 'torchao'"
    ):
        advice_of(report(), "tflite")  # type: ignore[arg-type]


def test_an_advice_note_warned_keeps_its_kind_in_a_copy() -> None:
    """A NoteWarning carries its typed note; pytest-xdist and multiprocessing rebuild a warning from its
    args (a copy that lost the note broke an xdist worker), so the copy is whole."""
    equalizing = report(equalization_mapping=EqualizationMapping(entries=(EqualizationEntry(fqn="fc1"),)))
    (note,) = advice_of(equalizing, "pt2e").notes
    copied = pickle.loads(pickle.dumps(qinsight.errors.NoteWarning(note)))
    assert isinstance(copied, UserWarning) and copied.note == note and str(copied) == note.text
    assert type(copied)(*copied.args).note == note
