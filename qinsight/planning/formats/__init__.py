"""``qinsight.plan_formats``, the second planner: a torchao ``quantize_`` format per Linear
(:mod:`.format_planner`), its ladders of formats and the order of moves down them (:mod:`.ladders`), and the
cheap rankings it is compared with (:mod:`.proxies`). It shares the scores (:mod:`qinsight.planning.scores`)
and the one trial of a config (:mod:`qinsight.apply.trial`) with :func:`qinsight.plan`."""

from qinsight.planning.formats.format_planner import format_goal, plan_formats

__all__ = ["format_goal", "plan_formats"]
