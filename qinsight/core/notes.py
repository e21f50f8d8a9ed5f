"""What a result says besides its numbers, as typed notes: a :class:`NoteKind` for code (and tests) to act
on, and the sentence people read. Rewording a note changes its text, never its kind.

Advice, a report's verification, a plan and a format plan all carry notes; report files keep both the kind
and the text (a file before 4.0 kept the text alone: its notes read back as :attr:`NoteKind.OTHER`). A
check of a suggestion (a plan's, a verification's) says why it was kept or dropped the same way: its
``why`` is a kind, its ``reason`` the words (since 4.1).
"""

from __future__ import annotations

import enum

import attrs


class NoteKind(enum.Enum):
    """What a note says."""

    # advice: what a builder of the config must know besides
    OTHER_FLOW = "other_flow"  # a plan made for another flow: its config is not verified in this one
    SMOOTHED_MODEL = "smoothed_model"  # the config is for the smoothed model (qinsight.smoothed)
    BIAS_CORRECTED = "bias_corrected"  # the config is for the model with its biases corrected (qinsight.bias_corrected)
    UNEQUALIZED = "unequalized"  # the flow has no input-weight equalization: those modules stay unequalized
    CALLS_MERGED = "calls_merged"  # a module's calls were advised apart; the flow configures the module once
    # a config quantized for real (verification and plans)
    LEFT_FLOAT = "left_float"  # the flow, as converted, left in float layers the config quantizes
    FAILED_CONFIGS = "failed_configs"  # candidate configs the flow could not build or run, left out
    # the report's verification
    NOTHING_SUGGESTED = "nothing_suggested"  # the report suggests nothing the flow's default does not do
    DEFAULT_OFFERED = "default_offered"  # the report's config scored below the flow's default: the default
    YOURS_FAILED = "yours_failed"  # the user's quantizer cannot quantize the model in the flow
    UNFOLDED_NORMS = "unfolded_norms"  # the flow quantizes batch norms apart from the convs before them
    KEEP_YOURS = "keep_yours"  # the user's quantizer scored above the report's config
    # plans
    SEARCH_ORDER = "search_order"  # which order of the sites the search kept, of two
    DEFAULT_RETURNED = "default_returned"  # the plan scored below the default config: the default is returned
    BISECTED = "bisected"  # the real flow missed the simulation's target: steps undone by bisection
    UNSEEN_DROPPED = "unseen_dropped"  # parts the search could not see dropped: they lowered the real score
    HELD_OUT_MISS = "held_out_miss"  # the target met on the data the plan was chosen on, not on the held-out
    NO_HELD_OUT = "no_held_out"  # no held-out data: the score is the one the plan was chosen on
    AT_BOUND = "at_bound"  # the target held at a confidence bound, not at the score
    MISSED_AT_BOUND = "missed_at_bound"  # the target does not hold at the confidence bound
    SLOWER_THAN_FLOAT = "slower_than_float"  # the plan's lowered program runs slower than the float program
    SPEED_MISSED = "speed_missed"  # the plan's lowered program misses the speed bound asked beside the target
    UNREACHABLE = "unreachable"  # not even the most bits reach the target
    BUDGET_OVER_TARGET = "budget_over_target"  # the budget needs more moves down than the target allows
    # format plans
    TIED_WEIGHTS = "tied_weights"  # Linears left float: their weights are shared with another module
    NO_FORMAT_FITS = "no_format_fits"  # Linears left float: no format's groups divide their inputs
    ONE_SEARCH_BATCH = "one_search_batch"  # ranked and sized on the same tokens: the search score flatters
    FLOAT_PERPLEXITY = "float_perplexity"  # the float model's perplexity, which the scores are ratios to
    STORED_BITS = "stored_bits"  # torchao stores more bits per weight than the plan counts
    RANKING = "ranking"  # the plan follows a cheaper ranking than the measured one: it scored best
    # why a check of a suggestion kept it or dropped it (a plan's checks, a verification's)
    MEASURED_REAL = "measured_real"  # kept: quantized for real with and without it (prepare, calibrate, convert)
    HURTS = "hurts"  # dropped: the output scored worse with it among the other suggestions
    FLOW_CANNOT_RUN = "flow_cannot_run"  # dropped: with it the flow cannot build or run the config
    ALREADY_DEFAULT = "already_default"  # kept: the flow's default config does it already
    NOT_MEASURED = "not_measured"  # kept unmeasured: the flow's default does not quantize the site
    YOURS_DECIDES = "yours_decides"  # not applied: the plan starts from the user's quantizer, which decides it
    # (UNEQUALIZED and UNSEEN_DROPPED above say why an equalization or an unseen part was not applied)
    OTHER = "other"  # a note of a file before 4.0, a check's reason before 4.1: its text alone


@attrs.frozen
class Note:
    """One note: its ``kind`` and the sentence people read (what ``str()`` gives)."""

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


class NoteWarning(UserWarning):
    """A note qinsight warns with where a config is built from advice (a flow that cannot do all of it, a
    plan made for another flow): the message is its text, ``note`` the typed :class:`Note`, so that a
    program can filter on this category and act on the kind."""

    def __init__(self, note: Note) -> None:
        super().__init__(note)  # its one argument, so that a pickled or re-raised copy is whole; str(): the text
        self.note = note


__all__ = ["Note", "NoteKind", "NoteWarning"]
