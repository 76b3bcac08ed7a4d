"""Settings a run would not read are refused (engines/options.py), and what an engine
claims to read, its code reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainthrough.config import RunConfig
from trainthrough.engines import registry
from trainthrough.engines.options import ENGINE_SETTINGS, MECHANISM_SETTINGS
from trainthrough.errors import UserError
from trainthrough.lab.validate import validate_run

SRC = Path(__file__).resolve().parents[1] / "src" / "trainthrough"
# Where each (engine, paradigm) runs: Ray's data parallel is the gloo controller with
# ranks on actors; a user's loop (loop/) runs on both.
CODE = {("sim", "ps"): ["engines/sim"], ("sim", "dp"): ["engines/sim"],
        ("ray", "ps"): ["engines/ray"], ("ray", "dp"): ["engines/ray", "engines/gloo", "loop"],
        ("gloo", "dp"): ["engines/gloo", "loop"]}


def _read(folders: list[str]) -> str:
    return "\n".join(p.read_text() for f in folders for p in (SRC / f).rglob("*.py"))


@pytest.mark.parametrize(("engine", "paradigm"), list(CODE))
def test_an_engine_claims_only_settings_its_code_reads(engine: str, paradigm: str) -> None:
    claimed = registry.entry(engine).capabilities[paradigm].options
    code = _read(CODE[(engine, paradigm)])
    assert claimed, "every engine reads some setting of its own"
    for name in claimed:
        assert re.search(rf"\bcfg\.{name}\b|\b{name}=", code), (engine, paradigm, name)


def test_every_setting_has_a_reader_and_a_scope() -> None:
    readers = {k for e in registry.names() for c in registry.entry(e).capabilities.values()
               for k in c.options}
    assert readers == set(ENGINE_SETTINGS)
    assert not set(ENGINE_SETTINGS) & set(MECHANISM_SETTINGS)
    assert set(ENGINE_SETTINGS) | set(MECHANISM_SETTINGS) <= set(RunConfig.__dataclass_fields__)


@pytest.mark.parametrize(("kw", "words"), [
    (dict(wall_limit=5.0), "--wall-limit is not used by the sim engine; only ray reads it"),
    (dict(paradigm="dp", strategy="rollback", wall_limit=5.0), "only ray and gloo read it for --paradigm dp"),
    (dict(recovery_delay=1.0), "--recovery-delay is not used by the sim engine"),
    (dict(ranks=2), "--ranks is not used by the sim engine; it does not apply to --paradigm ps"),
    (dict(engine="ray", consistency="async", shards=1, ranks=2), "--ranks is not used by the ray"),
    (dict(replicas=2), "--replicas has no effect with strategy checkpoint-restart"),
    (dict(staleness=4), "only --consistency ssp has a staleness bound"),
    (dict(engine="ray", consistency="async", strategy="chain-sync", max_lag=8),
     "only an asynchronous chain"),
    (dict(engine="ray", consistency="async", merge_rule="sum"), "only the stateless outage"),
    (dict(checkpoint_rule="random"), "only prioritized checkpoints"),
])
def test_an_unread_setting_is_refused_naming_what_reads_it(kw: dict, words: str) -> None:
    with pytest.raises(UserError, match=re.escape(words)):
        validate_run(RunConfig(workload="mlr", **kw))


@pytest.mark.parametrize("kw", [
    dict(consistency="ssp", staleness=4),
    dict(strategy="scar", checkpoint_fraction=0.5, checkpoint_rule="random"),
    dict(engine="ray", consistency="async", strategy="chain-async", replicas=2, max_lag=8,
         wall_limit=3.0, recovery_delay=0.5),
    dict(engine="ray", consistency="async", strategy="stateless", merge_rule="scaled",
         merge_threshold=9, backlog=16),
    dict(paradigm="dp", engine="gloo", strategy="rollback", ranks=2, micro_batches=2,
         wall_limit=5.0, recovery_delay=0.1),
    dict(paradigm="dp", strategy="rollback", ranks=2, elastic="keep-local", replace=False),
    dict(replicas=3, staleness=2, wall_limit=None),  # defaults are never refused
])
def test_settings_a_run_reads_are_accepted(kw: dict) -> None:
    validate_run(RunConfig(workload="mlr", **kw))
