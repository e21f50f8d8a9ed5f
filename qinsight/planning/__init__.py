"""Plans that reach a quality target: suggestions verified by applying them, sensitivity measured end
to end, sites kept in float until the target holds (``qinsight.plan``)."""

from qinsight.core.progress import Progress
from qinsight.planning.formats import plan_formats
from qinsight.planning.search import plan

__all__ = ["Progress", "plan", "plan_formats"]
