"""``trainthrough advise``: which strategy, at which interval, for a workload, an engine
and a failure rate; calibrated by short real runs, predicted by the project's models."""

from trainthrough.lab.advise.advisor import Advice, advise, clock_name, trace_spec
from trainthrough.lab.advise.measured import DpAdvice, advise_dp

__all__ = ["Advice", "DpAdvice", "advise", "advise_dp", "clock_name", "trace_spec"]
