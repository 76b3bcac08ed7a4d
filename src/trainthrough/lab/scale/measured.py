"""The figures measured on this machine that the scale model starts from.

Each is a default of :class:`~trainthrough.lab.scale.params.ScaleParams` (every one can
be overridden with ``--option``), kept here with where it was measured, so that the
calibration is one documented file (docs/scale-suite.md quotes it). They are the same
figures the data-parallel suite's cost model uses (lab/suites/dataparallel_cost.py),
read off the gloo engine on a 2-core machine, CPU only, on 127.0.0.1:

- a crash is seen by the survivors ~25 ms after it (a connection reset) and they
  re-form a group of 4 ranks in ~0.3 s (``benchmarks/dp_recovery.py``, docs/benchmarks.md);
- a replacement rank joins 0.19 s after the failure when forked from a warm zygote,
  2.12 s started cold; checkpoint-restart's new group takes its first step 0.22 s
  (warm) or 3.83 s (cold) after the failure (``benchmarks/rank_start.py --repeats 3``,
  mlr on 4 ranks, medians, docs/benchmarks.md);
- a rendezvous costs the store ~0.11 ms per joining rank (one ``set``, ``add`` and
  ``get`` of torch's TCPStore from one client, 3,000 ranks, median of 3 runs,
  2026-11-27): the serial part of re-forming a group, which grows with its size;
- a checkpoint write reaches >= 80% of a plain crash-safe write of the same bytes, and
  a joiner's state transfer >= 70% of a plain ``dist.broadcast`` (the acceptance lines
  of ``benchmarks/scale.py`` and ``benchmarks/overhead.py``, which they pass here).

What the measurements cannot give is the size of a real cluster: bandwidths are the
suite's options (a byte count over a bandwidth, times the efficiency above), and the
rendezvous is the only cost that grows with the number of accelerators.
"""

from __future__ import annotations

DETECT_SECONDS = 0.025  #: crash to the survivors knowing (gloo, connection reset)
REFORM_SECONDS = 0.3  #: survivors build a new group of 4 ranks (gloo)
RENDEZVOUS_MS_PER_RANK = 0.11  #: the store's serial work per joining rank (TCPStore)
WARM_JOIN_SECONDS = 0.19  #: failure to a replacement joining, forked warm
COLD_JOIN_SECONDS = 2.12  #: failure to a replacement joining, started cold
WARM_RESTART_SECONDS = 0.22  #: failure to a restarted group's first step, warm ranks
COLD_RESTART_SECONDS = 3.83  #: failure to a restarted group's first step, cold ranks
WRITE_EFFICIENCY = 0.8  #: our checkpoint write over a plain write of the same bytes
TRANSFER_EFFICIENCY = 0.7  #: our state transfer over a plain broadcast of the same bytes
