"""``events.jsonl`` has one schema: the dataclasses of :mod:`trainthrough.events`.

Every record real runs write parses back, strictly (no unknown key, every value of its
field's type), into its dataclass, and ``docs/events.md`` lists exactly those kinds and
fields (its schema section is generated from them).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trainthrough import events as ev
from trainthrough.config import CostModel, RunConfig
from trainthrough.lab.runner import run
from trainthrough.lab.validate import for_strategy

DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"


def _parsed(out: Path) -> list[ev.Event]:
    lines = (out / "events.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    parsed = [ev.parse(r) for r in records]
    for r, e in zip(records, parsed, strict=True):  # and it writes back the same record
        assert {**e.to_record(), **{k: r[k] for k in ev.STAMPS if k in r}} == r
    return parsed


def _kinds(parsed: list[ev.Event]) -> set[str]:
    return {e.type for e in parsed}


def test_the_docs_schema_is_the_dataclasses() -> None:
    text = DOC.read_text()
    assert ev.write_schema(text) == text, ("docs/events.md's schema section is stale: "
                                           "python -m trainthrough.events prints it")
    documented = [line[5:line.index("`", 5)] for line in text.splitlines()
                  if line.startswith("### `")
                  and text.index(line) > text.index(ev.SCHEMA_BEGIN)]
    assert documented == list(ev.KINDS)


def test_every_kind_is_a_frozen_keyword_only_record_with_its_own_tag() -> None:
    assert len(ev.KINDS) == 36
    for tag, cls in ev.KINDS.items():
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert params.frozen and cls.__dataclass_fields__  # type: ignore[attr-defined]
        assert all(f.kw_only for f in dataclasses.fields(cls)), tag
        assert cls.type == tag


def test_parse_refuses_what_the_schema_does_not_have() -> None:
    ok = {"type": "restored", "step": 3, "sim_seconds": 1.0}
    assert ev.parse(ok) == ev.Restored(step=3)
    for bad in ({"type": "restored"}, {"type": "restored", "step": "3"},
                {"type": "restored", "step": 3, "extra": 1}, {"type": "nope"}):
        with pytest.raises(ValueError):
            ev.parse(bad)
    rec = ev.ReplacementLost(member="a", kind="shard", replaced_by="b", for_="c")
    assert rec.to_record()["for"] == "c" and ev.parse(rec.to_record()) == rec


def test_sim_ps_records_parse_into_their_dataclasses(tmp_path: Path) -> None:
    run(RunConfig(workload="mlr", max_iterations=60, checkpoint_every=10, eval_every=10,
                  strategy="worker-copy", failures=["shard=1@iter=25", "worker=0@iter=40"]),
        tmp_path / "ps")
    kinds = _kinds(_parsed(tmp_path / "ps"))
    assert {"failure", "detection", "recovery", "checkpoint"} <= kinds, kinds


@pytest.mark.parametrize("strategy", ["rollback", "checkpoint-restart"])
def test_sim_dp_records_parse_into_their_dataclasses(tmp_path: Path, strategy: str) -> None:
    run(for_strategy(RunConfig(workload="mlr", paradigm="dp", ranks=4, max_iterations=60,
                               checkpoint_every=10, eval_every=10, elastic="keep-local",
                               cost=CostModel(replace_seconds=0.05),
                               failures=["rank=1@iter=25,phase=allreduce:0", "rank=2@iter=40"]),
                     strategy), tmp_path / "dp")
    kinds = _kinds(_parsed(tmp_path / "dp"))
    assert {"failure", "detection", "recovery"} <= kinds, kinds
    assert ({"reform", "rank-joined"} if strategy == "rollback"
            else {"checkpoint"}) <= kinds, kinds


def test_gloo_dp_records_with_a_failure_parse_into_their_dataclasses(tmp_path: Path) -> None:
    run(RunConfig(workload="mlr", paradigm="dp", engine="gloo", ranks=3, max_iterations=40,
                  eval_every=10, strategy="rollback",
                  stop_at_target=False, failures=["rank=1@iter=15"]),
        tmp_path / "gloo")
    kinds = _kinds(_parsed(tmp_path / "gloo"))
    assert {"failure", "detection", "reform", "training-resumed", "recovery"} <= kinds, kinds
