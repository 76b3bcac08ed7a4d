"""The regression corpus of bad input (issue 8): every case ends the same way.

Each case is a ``trainthrough run`` command line, plus whatever broken file it needs
(written into ``tmp_path``), that a user could plausibly type. Every one must end with
exit code 2, exactly one non-empty line on stderr, no traceback anywhere, no
``summary.json`` under ``--out`` (no run folder passed off as complete; none at all
when the input is refused before the run), and no training step: the engine's
``run`` is replaced by one that fails the test. Cases that are valid do not belong
here. A handful run the real console entry point in a subprocess to prove the real
exit code.
"""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, get_origin

import numpy as np
import pytest

from trainthrough.config import CostModel, RunConfig
from trainthrough.lab import runner
from trainthrough.workloads.idx import write_idx

Case = Callable[[Path], list[str]]  # tmp_path -> the arguments after `run`


def _args(*args: str) -> Case:
    return lambda _tmp: list(args)


# -- command-line flags ------------------------------------------------------------
# Invalid values of every numeric flag: a whole-number flag never takes text, a
# fraction, a sign, a 23-digit number, nothing, or another script's digits; each
# also gets the zero it refuses. Floats never take nan or inf (typed, or overflowed).
_INT_FLAGS = {"--shards": 0, "--workers": 0, "--ranks": 0, "--staleness": None,
              "--seed": None, "--checkpoint-every": 0, "--checkpoint-keep": 0,
              "--max-iterations": 0, "--eval-every": 0, "--replicas": 0,
              "--merge-threshold": 0, "--max-restarts": None}
_INT_BAD = ["-1", "abc", "1.5", "99999999999999999999999", "", "\u0663", "1_0", "0x10"]
_FLOAT_BAD = {"--lr": ["0", "-1", "nan", "inf", "1e999", "abc", ""],
              "--target": ["nan", "inf", "1e999", "abc", "NaN"],
              "--checkpoint-fraction": ["0", "-0.5", "1.5", "nan", "inf", "abc"],
              "--recovery-delay": ["-1", "nan", "inf", "abc"],
              "--wall-limit": ["0", "-1", "nan", "inf", "abc"],
              "--keep-warm": ["0", "-1", "nan", "inf", "abc"],
              "--liveness-timeout": ["0", "-1", "nan", "inf", "abc"],
              "--straggler-deadline": ["0", "-1", "nan", "inf", "abc"]}
_ENUM_FLAGS = ["--engine", "--paradigm", "--consistency", "--elastic", "--checkpoint-rule",
               "--coordinator", "--merge-rule", "--workload", "--strategy"]

CLI: dict[str, Case] = {}
for _flag, _zero in _INT_FLAGS.items():
    for _v in _INT_BAD + ([str(_zero)] if _zero is not None else []):
        CLI[f"{_flag}={_v!r}"] = _args(_flag, _v)
for _flag, _vals in _FLOAT_BAD.items():
    for _v in _vals:
        CLI[f"{_flag}={_v!r}"] = _args(_flag, _v)
for _flag in _ENUM_FLAGS:
    CLI[f"{_flag}=unknown"] = _args(_flag, "nope")
    CLI[f"{_flag}=empty"] = _args(_flag, "")
CLI.update({
    "seed above 2**32": _args("--seed", "4294967296"),
    "seed overflows torch": _args("--seed", "99999999999999999999999"),
    "seed -2**63": _args("--seed", "-9223372036854775808"),
    "max-iterations above int64": _args("--max-iterations", "9223372036854775808"),
    "lr underflows to 0": _args("--lr", "1e-400"),
    "unknown flag": _args("--bogus", "1"),
    "flag without value": _args("--shards"),
    "positional junk": _args("junk"),
    "strategy composition unknown base": _args("--strategy", "base=nope"),
    "strategy composition unknown key": _args("--strategy", "base=none,color=red"),
    "strategy composition empty value": _args("--strategy", "base=checkpoint-restart,persist="),
    "strategy with a newline": _args("--strategy", "none\nscar"),
    "workload with a newline": _args("--workload", "mlr\nmf"),
    "checkpoint-dir unknown protocol": _args("--checkpoint-dir", "nosuchproto://x"),
    # Combinations of valid values that no engine runs.
    "dist engine without dp": _args("--engine", "dist"),
    "dp with async consistency on ray": _args("--paradigm", "dp", "--engine", "ray",
                                              "--consistency", "async", "--strategy", "rollback"),
    "async consistency on sim": _args("--consistency", "async"),
    "ssp on ray": _args("--engine", "ray", "--consistency", "ssp"),
    "zookeeper without hosts": _args("--coordinator", "zookeeper"),
    "keep-warm without a cluster": _args("--engine", "ray", "--keep-warm", "60"),
    "keep-warm on sim": _args("--ray-address", "127.0.0.1:1", "--keep-warm", "60"),
    "keep-warm zero": _args("--engine", "ray", "--ray-address", "127.0.0.1:1",
                            "--keep-warm", "0"),
    "dp strategy on ps": _args("--strategy", "lossy-forward"),
    "ps strategy on dp": _args("--paradigm", "dp", "--strategy", "scar"),
    "chain strategy under bsp": _args("--engine", "ray", "--strategy", "chain-sync"),
    # Settings the run would not read: refused, never dropped (engines/options.py).
    "wall-limit on sim": _args("--wall-limit", "5"),
    "recovery-delay on sim": _args("--recovery-delay", "2"),
    "ray-address on sim": _args("--ray-address", "127.0.0.1:1"),
    "max-restarts on the parameter server": _args("--max-restarts", "2"),
    "max-restarts negative on gloo": _args("--paradigm", "dp", "--engine", "gloo",
                                           "--strategy", "rollback", "--max-restarts", "-1"),
    "straggler-deadline on ray": _args("--paradigm", "dp", "--engine", "ray",
                                       "--strategy", "rollback", "--straggler-deadline", "1"),
    "straggler-deadline on the parameter server": _args("--straggler-deadline", "1"),
    "straggler-deadline not below the collective timeout": _args(
        "--paradigm", "dp", "--engine", "gloo", "--strategy", "rollback",
        "--straggler-deadline", "10"),
    "straggler-deadline with a relaxed sync": _args(
        "--paradigm", "dp", "--engine", "gloo", "--strategy", "localsgd",
        "--straggler-deadline", "1"),
    "liveness-timeout zero on gloo": _args("--paradigm", "dp", "--engine", "gloo",
                                           "--strategy", "rollback", "--liveness-timeout", "0"),
    # Addresses (issue 26): one IPv4 address of this machine, never every interface.
    "bind-address not an address": _args("--paradigm", "dp", "--engine", "gloo",
                                         "--strategy", "rollback", "--bind-address", "host"),
    "bind-address every interface": _args("--paradigm", "dp", "--engine", "gloo",
                                          "--strategy", "rollback", "--bind-address", "0.0.0.0"),
    "bind-address not of this machine": _args("--paradigm", "dp", "--engine", "gloo",
                                              "--strategy", "rollback",
                                              "--bind-address", "192.0.2.254"),
    "bind-address on the parameter server": _args("--bind-address", "127.0.0.1"),
    "checkpoint-shared without a cluster": _args("--paradigm", "dp", "--engine", "ray",
                                                 "--strategy", "rollback",
                                                 "--checkpoint-dir", "x",
                                                 "--checkpoint-shared"),
    "multi-host checkpoint-restart on a local path": _args(
        "--paradigm", "dp", "--engine", "ray", "--ray-address", "127.0.0.1:1",
        "--checkpoint-dir", "ckpt"),
    "zookeeper coordinator on sim": _args("--coordinator", "zookeeper",
                                          "--zookeeper-hosts", "127.0.0.1:1"),
    "zookeeper hosts without zookeeper": _args("--engine", "ray", "--consistency", "async",
                                               "--zookeeper-hosts", "127.0.0.1:1"),
    "replicas without a chain": _args("--replicas", "2"),
    "staleness under bsp": _args("--staleness", "5"),
    "merge-rule without stateless": _args("--merge-rule", "sum"),
    "merge-threshold without stateless": _args("--engine", "ray", "--consistency", "async",
                                               "--merge-threshold", "9"),
    "checkpoint-fraction with full saves": _args("--checkpoint-fraction", "0.5"),
    "checkpoint-rule with full saves": _args("--checkpoint-rule", "random"),
    "ranks on ps": _args("--ranks", "3"),
    "micro-batches on ps": _args("--micro-batches", "2"),
    "shards on dp": _args("--paradigm", "dp", "--strategy", "rollback", "--shards", "2"),
    "workers on gloo": _args("--paradigm", "dp", "--engine", "gloo", "--strategy", "rollback",
                             "--workers", "2"),
    # Accepted and silently not used before (issue 32).
    "shards at its default on dp": _args("--paradigm", "dp", "--strategy", "rollback",
                                         "--shards", "4"),
    "checkpoint-every without checkpoints": _args("--paradigm", "dp", "--strategy",
                                                  "localsgd", "--checkpoint-every", "2"),
    "checkpoint-every without checkpoints on gloo": _args(
        "--paradigm", "dp", "--engine", "gloo", "--strategy", "localsgd",
        "--checkpoint-every", "2"),
    "checkpoint-keep without checkpoints": _args("--strategy", "none",
                                                 "--checkpoint-keep", "2"),
    "device with a newline": _args("--paradigm", "dp", "--engine", "gloo", "--strategy",
                                   "rollback", "--device", "cuda\n"),
    # Impossible sizes: refused when the workload is built, before the run folder.
    "more shards than rows": _args("--shards", "100000"),
    "more workers than batches": _args("--workers", "100000"),
    "more ranks than samples": _args("--paradigm", "dp", "--strategy", "rollback",
                                     "--ranks", "100000"),
})

# -- workload options (--option key=value) --------------------------------------------
_OPTIONS = {
    "mlr": ["batch_size=0", "batch_size=-1", "batch_size=abc", "batch_size=1.5",
            "batch_size=nan", "batch_size=true", "batch_size=", "batch_size=100000",
            "l2=-1", "l2=nan", "l2=inf", "l2=abc", "bogus=1", "seed=3", "Batch_Size=32",
            "train_images=/x", "target=nan", "test_labels=/nonexistent"],
    "mf": ["eta=0", "eta=2", "rank=0", "density=0", "density=1.5", "n_users=0",
           "n_users=1000000000", "rank=100000000", "data_seed=-1", "data_seed=4294967296",
           "reg=-1", "noise=nan", "init_scale=-1", "density=0.0000001",
           "ratings_file=/nonexistent/u.data", "target=inf"],
    "lda": ["n_topics=1", "alpha=0", "beta=-1", "blocks=0", "n_words=1000000000",
            "n_docs=0", "doc_length=0", "fold_in_iterations=0", "docword_file=/nonexistent"],
    "ridge": ["d=600", "n=0", "lr=0", "lam=-1", "n=100000000", "noise=inf"],
    "cnn": ["metric=f1", "lr=0", "test_limit=0", "batch_size=0", "train_images=/x",
            "target=nan"],
}
OPTIONS: dict[str, Case] = {
    f"{w} {o}": _args("--workload", w, "--option", o) for w, opts in _OPTIONS.items() for o in opts
}
OPTIONS.update({
    "option without =": _args("--option", "batch_size"),
    "option without key": _args("--option", "=3"),
    "option for another workload": _args("--workload", "mlr", "--option", "rank=3"),
})

# -- failure specs (--fail) ---------------------------------------------------------
_SPECS = [
    "shards=1", "shards=1@@iter=3", "@iter=3", "shards=1@", "disk=1@iter=3",
    "shards=150%@iter=3", "shards=0%@iter=3", "shards=-5%@iter=3", "shards=nan%@iter=3",
    "shards=%@iter=3", "shards=x@iter=3", "shards=1,,2@iter=3", "shards=1,1@iter=3",
    "shards=-1@iter=3", "shards=9@iter=3", "worker=4@iter=3", "rank=0@iter=3",
    "replica=0@iter=3", "shards@iter=3", "shards=1@iter=-3", "shards=1@iter=abc",
    "shards=1@iter=", "shards=1@iter=1.5", "shards=1@iter=\u00b2", "shards=\u00b2@iter=3",
    "shards=1@iter=\u0663", "shards=1@iter=99999999999999999999", "shards=1@time=soon",
    "shards=1@time=-1s", "shards=1@time=1h", "shards=1@time=\u0663s", "shards=1@time=" + "9" * 400,
    "shards=1@mtbf=0s", "shards=1@mtbf=10", "shards=1@mtbf=-5s", "shards=1@mtbf=1e3s",
    "shard=any@mtbf=1s,max=200000000", "shard=any@mtbf=1s,max=0", "shard=any@mtbf=1s,max=x",
    "shard=any@mtbf=1s,max=\u00b2", "shards=1@iter=3,max=2", "shards=1@when=3",
    "shards=1@iter=3,phase=lunch", "shards=1@iter=3,phase=allreduce:", "shards=1@iter=3,mode=explode",
    "shards=1@iter=3,color=red", "shards=1@iter=3,phase", "shards=1@iter=3,phase=forward,phase=update",
    "shards=1@iter=3,replica=-1", "shards=1@iter=3,replica=99999999999999999999",
    "rank=1@iter=3\nshards=1@iter=4", "SHARDS=1@iter=3",
    # Pauses and slow ranks: a duration with a unit above 0, a factor above 1.
    "rank=1@iter=3,mode=pause", "rank=1@iter=3,mode=pause:", "rank=1@iter=3,mode=pause:5",
    "rank=1@iter=3,mode=pause:0s", "rank=1@iter=3,mode=pause:-5s",
    "rank=1@iter=3,mode=pause:5h", "rank=1@iter=3,mode=pause:2min,mode=hang",
    "rank=1@iter=3,mode=pause:99999s", "rank=1@iter=3,mode=pause:\u0663s",
    "rank=1@iter=3,mode=slow", "rank=1@iter=3,mode=slow:4", "rank=1@iter=3,mode=slow:1x",
    "rank=1@iter=3,mode=slow:0.5x", "rank=1@iter=3,mode=slow:x", "rank=1@iter=3,mode=slow:nanx",
    "rank=1@iter=3,mode=slow:1e3x", "rank=1@iter=3,mode=slow:4X",
    "rank=1@iter=3,mode=slow:1001x",
    "rank=1@iter=3,mode=preempt", "rank=1@iter=3,mode=preempt:", "rank=1@iter=3,mode=preempt:0s",
    "rank=1@iter=3,mode=preempt:10", "rank=1@iter=3,mode=preempt:5iter",
    "rank=1@iter=3,mode=preempt:4000s", "rank=1@iter=3,mode=preempt:\u0663s",
    # A partition: a duration with a unit, above 0 (sim only: the cases below).
    "rank=1@iter=3,mode=partition", "rank=1@iter=3,mode=partition:",
    "rank=1@iter=3,mode=partition:5", "rank=1@iter=3,mode=partition:0s",
    "rank=1@iter=3,mode=partition:-5s", "rank=1@iter=3,mode=partition:5h",
    "rank=1@iter=3,mode=partition:99999s", "rank=1@iter=3,mode=partition:\u0663s",
    "rank=1@iter=3,mode=partition:5s,mode=pause:5s", "shards=1@iter=3,mode=partition",
]
SPECS: dict[str, Case] = {f"--fail {s!r}": _args("--fail", s) for s in _SPECS}
SPECS.update({
    "second --fail bad": _args("--fail", "shards=1@iter=3", "--fail", "x"),
    "semicolon-joined, one bad": _args("--fail", "shards=1@iter=3;shards=7@iter=4"),
    "dp rank beyond ranks": _args("--paradigm", "dp", "--strategy", "rollback",
                                  "--fail", "rank=7@iter=5"),
    "dp allreduce bucket beyond buckets": _args("--paradigm", "dp", "--strategy", "rollback",
                                                "--fail", "rank=0@iter=1,phase=allreduce:4"),
    "dp worker kind": _args("--paradigm", "dp", "--strategy", "rollback",
                            "--fail", "worker=0@iter=1"),
    # Engines that cannot pause or slow a rank refuse it (their capabilities' modes;
    # sim runs them: tests/test_sim_kinds.py).
    "straggler-deadline past sim's collective timeout": _args(
        "--paradigm", "dp", "--strategy", "rollback", "--straggler-deadline", "20"),
    "straggler-deadline with a relaxed sync on sim": _args(
        "--paradigm", "dp", "--strategy", "localsgd", "--straggler-deadline", "1"),
    "slow of a shard on sim": _args("--fail", "shards=1@iter=3,mode=slow:4x"),
    "pause on ray dp": _args("--paradigm", "dp", "--engine", "ray", "--strategy", "rollback",
                             "--fail", "rank=1@iter=3,mode=pause:5s"),
    "slow on ray dp": _args("--paradigm", "dp", "--engine", "ray", "--strategy", "rollback",
                            "--fail", "rank=1@iter=3,mode=slow:4x"),
    "pause of a shard": _args("--engine", "ray", "--fail", "shards=1@iter=3,mode=pause:5s"),
    # engines that cannot deliver a preemption's notice refuse it (capabilities: modes);
    # sim's data parallel takes it (tests/test_sim_kinds.py)
    "sim ps preempt": _args("--fail", "shards=1@iter=3,mode=preempt:10s"),
    # A partition from a spec is sim's data parallel only: gloo's ranks share one host's
    # network, Ray's are cut by the two-host tests; and it must leave the controller a rank.
    "partition on gloo": _args("--paradigm", "dp", "--engine", "gloo", "--strategy",
                               "rollback", "--fail", "rank=1@iter=3,mode=partition:8s"),
    "partition on ray dp": _args("--paradigm", "dp", "--engine", "ray", "--strategy",
                                 "rollback", "--fail", "rank=1@iter=3,mode=partition:8s"),
    "partition of a shard on sim": _args("--fail", "shards=1@iter=3,mode=partition:8s"),
    "partition of every rank": _args("--paradigm", "dp", "--strategy", "rollback", "--ranks",
                                     "2", "--fail", "ranks=all@iter=3,mode=partition:8s"),
    "partition of every rank by ids": _args("--paradigm", "dp", "--strategy", "rollback",
                                            "--ranks", "2", "--fail",
                                            "ranks=0,1@iter=3,mode=partition:8s"),
    # A failure during a recovery, in a run where nothing else fails (never struck).
    "dp phase=recovery with nothing to recover": _args(
        "--paradigm", "dp", "--strategy", "diloco", "--fail", "rank=1@iter=3,phase=recovery"),
    "ps phase=recovery with nothing to recover": _args("--fail",
                                                       "shards=1@iter=3,phase=recovery"),
})


# -- config files (--config) --------------------------------------------------------
def _toml(text: str | bytes) -> Case:
    def make(tmp: Path) -> list[str]:
        p = tmp / "config.toml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["--config", str(p)]
    return make


def _wrong_value(hint: Any) -> str:
    """A TOML value of the wrong type for a field annotated ``hint``."""
    text = str(hint)
    if "dict" in text or get_origin(hint) is dict:
        return '"x"'
    if "list" in text:
        return "5"
    if "bool" in text:
        return '"yes"'
    if "int" in text:
        return '"four"'
    if "float" in text:
        return '"high"'
    if "CostModel" in text:
        return "5"
    return "5"  # str


_HINTS = {f.name: f.type for f in fields(RunConfig)}
TOML: dict[str, Case] = {
    f"toml {name} wrong type": _toml(f"{name} = {_wrong_value(hint)}\n")
    for name, hint in _HINTS.items()
}
TOML.update({f"toml cost.{f.name} wrong type": _toml(f'[cost]\n{f.name} = "fast"\n')
             for f in fields(CostModel)})
TOML.update({
    "toml shards = 2.5": _toml("shards = 2.5\n"),
    "toml shards = true": _toml("shards = true\n"),
    "toml seed = -1": _toml("seed = -1\n"),
    "toml seed huge": _toml("seed = 9223372036854775807\n"),
    "toml failures = 5": _toml("failures = 5\n"),
    "toml failures with a number": _toml('failures = ["shards=1@iter=3", 5]\n'),
    "toml failures malformed": _toml('failures = "shards=1@when=3"\n'),
    "toml target nan": _toml("target = nan\n"),
    "toml lr inf": _toml("lr = inf\n"),
    "toml lr -inf": _toml("lr = -inf\n"),
    "toml max_iterations empty": _toml('max_iterations = ""\n'),
    "toml max_iterations 0": _toml("max_iterations = 0\n"),
    "toml replace = 1": _toml("replace = 1\n"),
    "toml storage_bandwidth 0": _toml("[cost]\nstorage_bandwidth = 0\n"),
    "toml network_bandwidth -1": _toml("[cost]\nnetwork_bandwidth = -1.0\n"),
    "toml memory_bandwidth 0": _toml("[cost]\nmemory_bandwidth = 0\n"),
    "toml detection nan": _toml("[cost]\ndetection_seconds = nan\n"),
    "toml restart inf": _toml("[cost]\nrestart_seconds = inf\n"),
    "toml compute_scale -1": _toml("[cost]\ncompute_scale = -1\n"),
    "toml cost = 5": _toml("cost = 5\n"),
    "toml unknown cost key": _toml("[cost]\nbogus = 1\n"),
    "toml unknown key": _toml("bogus = 1\n"),
    "toml misspelt key": _toml("shard = 4\n"),
    "toml workload_options bad value": _toml("[workload_options]\nbatch_size = 0\n"),
    "toml workload_options string number": _toml('[workload_options]\nbatch_size = "32"\n'),
    "toml workload_options unknown": _toml("[workload_options]\nbogus = 1\n"),
    "toml engine unknown": _toml('engine = "gpu"\n'),
    "toml not TOML": _toml("shards =\n"),
    "toml garbage": _toml(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
    "toml not UTF-8": _toml(b'seed = 1\nworkload = "\xff\xfe"\n'),
    "toml Latin-1": _toml('workload = "m\u00e9lr"\n'.encode("latin-1")),
    "toml duplicate key": _toml("seed = 1\nseed = 2\n"),
    "toml array of tables": _toml("[[cost]]\ncompute_scale = 1.0\n"),
})
TOML.update({
    "config is a folder": lambda tmp: ["--config", str(tmp)],
    "config missing": lambda tmp: ["--config", str(tmp / "nope.toml")],
    "config then bad flag": lambda tmp: _toml("seed = 1\n")(tmp) + ["--shards", "0"],
})


# -- data files ---------------------------------------------------------------------
def _file(name: str, data: str | bytes, workload: str, option: str, *extra: str) -> Case:
    def make(tmp: Path) -> list[str]:
        p = tmp / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return ["--workload", workload, "--option", f"{option}={p}", *extra]
    return make


_GOOD_ML = "1\t1\t3\t0\n2\t2\t4\t0\n1\t2\t5\t0\n"
_MOVIELENS = {
    "empty": "", "blank lines": "\n\n\n", "all nan": "1\t1\tnan\t0\n2\t2\tnan\t0\n",
    "one nan": "1\t1\t3\t0\n2\t2\tnan\t0\n", "inf": "1\t1\tinf\n2\t2\t3\n",
    "float32 overflow": "1\t1\t1e39\n2\t2\t3\n", "one rating": "1\t1\t3\t0\n",
    "binary garbage": b"\x00\xff\x13garbage\x00\x00", "two columns": "1\t2\n3\t4\n",
    "five columns": "1\t2\t3\t4\t5\n", "text rating": "1::2::five::0\n",
    "csv header only": "userId,movieId,rating,timestamp\n",
    "csv wrong width": "userId,movieId,rating,timestamp\n1,2,3,4,5,6\n",
    "html page": "<html><body>404 Not Found</body></html>\n",
    "mixed separators": "1::1::3::0\n2\t2\t4\t0\n",
}
DATA: dict[str, Case] = {
    f"movielens {k}": _file("u.data", v, "mf", "ratings_file") for k, v in _MOVIELENS.items()
}
DATA.update({
    "movielens truncated gz": _file("u.data.gz", gzip.compress(_GOOD_ML.encode() * 50)[:-20],
                                    "mf", "ratings_file"),
    "movielens corrupt gz": _file("u.data.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"junk" * 8,
                                  "mf", "ratings_file"),
    "movielens missing": _args("--workload", "mf", "--option", "ratings_file=/nonexistent/u.data"),
    "movielens is a folder": lambda tmp: ["--workload", "mf", "--option", f"ratings_file={tmp}"],
})
_DOCWORD = "3\n5\n6\n1 1 2\n1 3 1\n2 2 4\n2 5 1\n3 1 1\n3 4 3\n"
_UCI = {
    "empty": "", "two header lines": "3\n5\n", "header text": "3\nfive\n6\n",
    "W claims 4e9 words": "3\n4000000000\n1\n1 1 1\n", "D claims 1e12 docs": "1000000000000\n5\n1\n1 1 1\n",
    "negative D": "-3\n5\n1\n1 1 1\n", "zero W": "3\n0\n0\n", "no entries": "3\n5\n0\n",
    "NNZ too large": "3\n5\n5\n1 1 1\n", "NNZ too small": "3\n5\n1\n1 1 1\n2 2 2\n",
    "docID out of range": "3\n5\n1\n4 1 1\n", "wordID zero": "3\n5\n1\n1 0 1\n",
    "count zero": "3\n5\n1\n1 1 0\n", "count huge": "1\n1\n1\n1 1 99999999999999999999999\n",
    "tokens exceed memory": "1\n1\n1\n1 1 2000000000\n", "fractional count": "3\n5\n1\n1 1 1.5\n",
    "two fields": "3\n5\n1\n1 1\n", "binary garbage": b"\x89PNG\r\n\x1a\n\x00\x00",
    "superscript id": "3\n5\n1\n\u00b9 1 1\n",
}
DATA.update({f"uci {k}": _file("docword.x.txt", v, "lda", "docword_file")
             for k, v in _UCI.items()})
DATA.update({
    "uci truncated gz": _file("docword.x.txt.gz", gzip.compress(_DOCWORD.encode())[:-12],
                              "lda", "docword_file"),
    "uci missing": _args("--workload", "lda", "--option", "docword_file=/nonexistent"),
})


def _uci_with_vocab(vocab: str) -> Case:
    def make(tmp: Path) -> list[str]:
        (tmp / "docword.txt").write_text(_DOCWORD)
        (tmp / "vocab.txt").write_text(vocab)
        return ["--workload", "lda", "--option", f"docword_file={tmp / 'docword.txt'}",
                "--option", f"vocab_file={tmp / 'vocab.txt'}"]
    return make


DATA["uci vocab too short"] = _uci_with_vocab("a\nb\n")
DATA["uci vocab empty"] = _uci_with_vocab("")

_LABELS = np.arange(64, dtype=np.uint8) % 10
_IDX_NAMES = ("train_images", "train_labels", "test_images", "test_labels")


def _idx(images: np.ndarray | bytes, labels: np.ndarray | bytes = _LABELS,
         test_images: np.ndarray | bytes | None = None) -> Case:
    """The four cnn IDX files, the broken ones given here, the rest well formed."""
    def make(tmp: Path) -> list[str]:
        args = ["--workload", "cnn"]
        arrays = (images, labels, images if test_images is None else test_images, labels)
        for name, arr in zip(_IDX_NAMES, arrays):
            p = tmp / f"{name}-idx"
            if isinstance(arr, bytes):
                p.write_bytes(arr)
            else:
                write_idx(p, arr)
            args += ["--option", f"{name}={p}"]
        return args
    return make


_IMG = np.zeros((64, 8, 8), np.uint8)
_IMG_BYTES = _IMG.tobytes()
_IMG_HEADER = struct.pack(">BBBB3I", 0, 0, 8, 3, 64, 8, 8)
DATA.update({
    "idx 1x1 images": _idx(np.zeros((64, 1, 1), np.uint8)),
    "idx not square": _idx(np.zeros((64, 8, 6), np.uint8)),
    "idx empty file": _idx(b""),
    "idx html page": _idx(b"<html>404 Not Found</html>"),
    "idx truncated data": _idx(_IMG_HEADER + _IMG_BYTES[:-10]),
    "idx trailing bytes": _idx(_IMG_HEADER + _IMG_BYTES + b"\x00"),
    "idx truncated header": _idx(_IMG_HEADER[:9]),
    "idx header claims 2**96 bytes": _idx(struct.pack(">BBBB3I", 0, 0, 8, 3, *(2**32 - 1,) * 3)),
    "idx unknown type code": _idx(b"\x00\x00\x07\x03" + _IMG_HEADER[4:] + _IMG_BYTES),
    "idx images and labels swapped": _idx(_LABELS, _IMG),
    "idx labels float": _idx(_IMG, np.zeros(64, np.float32)),
    "idx labels above 9": _idx(_IMG, np.full(64, 12, np.uint8)),
    "idx count mismatch": _idx(_IMG, _LABELS[:60]),
    "idx nan pixels": _idx(np.full((64, 8, 8), np.nan, np.float32)),
    "idx zero images": _idx(np.zeros((0, 8, 8), np.uint8), np.zeros(0, np.uint8)),
    "idx fewer than a batch": _idx(np.zeros((3, 8, 8), np.uint8), np.zeros(3, np.uint8)),
    "idx test size differs": _idx(_IMG, _LABELS, np.zeros((64, 6, 6), np.uint8)),
    "idx truncated gz": _idx(gzip.compress(_IMG_HEADER + _IMG_BYTES)[:-16]),
    "idx corrupt gz": _idx(b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"junk" * 8),
    "idx only one file given": lambda tmp: ["--workload", "cnn", "--option",
                                            f"train_images={tmp / 'x'}"],
})

# -- the run folder (--out) ---------------------------------------------------------
OUT: dict[str, Case] = {}


def _out_case(make_out: Callable[[Path], Path]) -> Case:
    return lambda tmp: ["--out", str(make_out(tmp))]


def _a_file(tmp: Path) -> Path:
    (tmp / "afile").write_text("not a folder\n")
    return tmp / "afile"


def _non_empty(tmp: Path) -> Path:
    (tmp / "used").mkdir()
    (tmp / "used" / "metrics.jsonl").write_text("{}\n")
    return tmp / "used"


OUT["out is a file"] = _out_case(_a_file)
OUT["out under a file"] = _out_case(lambda tmp: _a_file(tmp) / "run")
OUT["out two levels under a file"] = _out_case(lambda tmp: _a_file(tmp) / "a" / "b")
OUT["out is a used folder"] = _out_case(_non_empty)
OUT["out is /dev/null"] = _args("--out", "/dev/null")

CASES: dict[str, Case] = {**CLI, **OPTIONS, **SPECS, **TOML, **DATA, **OUT}


class _NoTraining:
    """Stands in for an engine: building it is allowed, running it fails the test."""

    def run(self) -> Any:
        raise AssertionError("bad input reached training; it must be refused before")


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sim engines may be built (some sizes are checked there), never run; no other
    engine is even built, so a regression cannot start Ray or gloo processes here."""
    build = runner.build_engine

    def guarded(cfg: RunConfig, *args: Any, **kwargs: Any) -> _NoTraining:
        assert cfg.engine == "sim", f"bad input reached the {cfg.engine} engine"
        build(cfg, *args, **kwargs)
        return _NoTraining()

    monkeypatch.setattr(runner, "build_engine", guarded)


def _summaries(folder: Path) -> list[Path]:
    return list(folder.rglob("summary.json")) if folder.is_dir() else []


def test_corpus_is_large() -> None:
    assert len(CASES) + len(OTHER_COMMANDS) >= 150


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line(name: str, cli, tmp_path: Path,  # noqa: ANN001
                                         no_training: None) -> None:
    default_out = tmp_path / "run"
    args = CASES[name](tmp_path)
    out = Path(args[args.index("--out") + 1]) if "--out" in args else default_out
    existed = out.exists()
    r = cli("run", "--quiet", "--engine", "sim", "--out", str(default_out), *args)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.code == 2, (name, r.code, r.err)
    assert len(lines) == 1 and lines[0].startswith("trainthrough: error: "), (name, r.err)
    assert len(lines[0]) > len("trainthrough: error: ") + 10, (name, r.err)
    assert "Traceback" not in r.out + r.err, name
    assert not _summaries(out) and not _summaries(default_out), name
    if not existed:
        assert not out.exists(), f"{name}: refused input left a folder {out}"


OTHER_COMMANDS = [[], ["bogus"], ["list", "extra"], ["compare", "--suite", "nope"],
                  ["compare", "--seeds", "0"], ["compare", "--seeds", "x"],
                  ["compare", "--seeds", "-3"], ["run", "--help-me"], ["release"],
                  ["release", "--ray-address", "nope"],
                  ["release", "--ray-address", "127.0.0.1:1"],
                  # Options the paradigm does not use, and a rank count with no survivor.
                  ["advise", "--paradigm", "dp", "--shards", "4", "--mtbf", "10s"],
                  ["advise", "--paradigm", "dp", "--ranks", "1", "--mtbf", "10s"]]


@pytest.mark.parametrize("argv", OTHER_COMMANDS, ids=" ".join)
def test_other_commands_exit_2_with_one_line(argv: list[str], cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "suite"
    r = cli(*argv, *(["--out", str(out)] if argv[:1] in (["compare"], ["advise"]) else []))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert r.err.startswith("trainthrough: error: ") and "Traceback" not in r.out + r.err
    assert not out.exists()


@pytest.mark.parametrize("args", [
    ["--shards", "abc"],
    ["--seed", "99999999999999999999999"],
    ["--fail", "shard=any@mtbf=1s,max=200000000"],
    ["--config", "NOT_UTF8"],
])
def test_real_process_exit_code(tmp_path: Path, args: list[str]) -> None:
    if "NOT_UTF8" in args:
        (tmp_path / "c.toml").write_bytes(b'workload = "\xff"\n')
        args = ["--config", str(tmp_path / "c.toml")]
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "trainthrough.cli", "run", "--quiet",
                        "--engine", "sim", "--out", str(out), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr + p.stdout
    assert p.stderr.startswith("trainthrough: error: ") and not out.exists()


def test_the_parser_answers_without_importing_torch() -> None:
    """``--help`` and a bad flag need the parser alone: before, building it imported the
    suites, the runner and with them torch, 3 s for one line."""
    code = ("import sys\nfrom trainthrough.cli import main\n"
            "for argv in (['--help'], ['compare', '--help'], ['run', '--bogus']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n"
            "        assert e.code in (0, 2), e.code\n"
            "print(sorted({'torch', 'ray', 'matplotlib'} & set(sys.modules)), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stderr.strip().splitlines()[-1] == "[]", p.stderr
