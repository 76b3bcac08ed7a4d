"""The lab at scale: a discrete-event model of a data-parallel job on 8 to 100,000
accelerators whose decisions are made by the runtime's own policy objects (model.py),
with costs measured on this machine (measured.py) scaled by the given bandwidths
(costs.py), checked against published figures (validation.py)."""
