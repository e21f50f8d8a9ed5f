"""Plans that reach a quality target or spend a budget, each config verified by quantizing for real.

``qinsight.plan`` (:mod:`.planner`, its stages in :mod:`.stages`, the search in :mod:`.search`): which
sites to keep in float in FX or PT2E, simulated (:mod:`.simulate`, :mod:`.simulated_flows`) and checked for real
(:mod:`.verify`). ``qinsight.plan_formats`` (:mod:`.formats`): a torchao format per Linear. Both score
through :mod:`.scores`."""

from qinsight.core.progress import Progress
from qinsight.planning.formats import plan_formats
from qinsight.planning.planner import plan

__all__ = ["Progress", "plan", "plan_formats"]
