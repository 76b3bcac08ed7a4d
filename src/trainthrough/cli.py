"""The ``trainthrough`` command: ``run``, ``list``, ``compare``, ``advise``, ``release``.

Bad input ends with one line on stderr and exit code 2 (argparse's own errors too);
everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from trainthrough.config import field_choices
from trainthrough.errors import (
    RunStalled,
    Terminated,
    UserError,
    interrupt,
    reason,
    terminated,
)
from trainthrough.fields import FLOAT_TEXT, INT_TEXT

if TYPE_CHECKING:
    from trainthrough.config import RunConfig


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")


def _int(text: str) -> int:
    if not INT_TEXT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def _float(text: str) -> float:
    # nan and inf parse, so that validation names the field that must be finite.
    if not FLOAT_TEXT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    return float(text)


def _kv(text: str) -> tuple[str, str]:
    """``key=value`` as text; typed later by the workload's signature (parse_option)."""
    k, eq, v = text.partition("=")
    if not eq or not k:
        raise argparse.ArgumentTypeError(f"{text!r} must be key=value")
    return k, v


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run one configuration and write its run folder")
    p.add_argument("--config", type=Path, help="a config.toml (CLI options override it)")
    p.add_argument("--workload", help="workload name (see `trainthrough list`)")
    p.add_argument("--strategy", help="strategy preset or composition")
    p.add_argument("--engine", help="engine: sim, ray or dist (dp only)")
    p.add_argument("--ray-address", dest="ray_address",
                   help="join this Ray cluster (default: start one on 127.0.0.1)")
    p.add_argument("--bind-address", dest="bind_address", metavar="IP",
                   help="dp: the address of this machine the run's store and local ranks "
                        "listen on (default 127.0.0.1; with --ray-address, this machine's "
                        "address on the cluster)")
    p.add_argument("--keep-warm", type=_float, dest="keep_warm", metavar="SECONDS",
                   help="with --ray-address: leave this run's actors on the cluster for "
                        "later runs (they start training in a fraction of a second), each "
                        "ended after SECONDS idle; `trainthrough release` ends them sooner")
    p.add_argument("--recovery-delay", type=_float, dest="recovery_delay",
                   help="seconds a lost shard or worker stays down (ray)")
    p.add_argument("--replicas", type=_int, help="chain length per shard (chain strategies)")
    p.add_argument("--coordinator", choices=field_choices("coordinator"))
    p.add_argument("--zookeeper-hosts", dest="zookeeper_hosts", help="host:port")
    p.add_argument("--merge-rule", dest="merge_rule",
                   choices=field_choices("merge_rule"),
                   help="stateless: how the backlog is applied")
    p.add_argument("--merge-threshold", type=_int, dest="merge_threshold")
    p.add_argument("--wall-limit", type=_float, dest="wall_limit",
                   help="real engines: stop after this many seconds")
    p.add_argument("--liveness-timeout", type=_float, dest="liveness_timeout",
                   metavar="SECONDS",
                   help="dp: a rank whose heartbeat stops this long is taken for dead "
                        "(default 30; a long step or evaluation keeps beating)")
    p.add_argument("--straggler-deadline", type=_float, dest="straggler_deadline",
                   metavar="SECONDS",
                   help="dp (gloo): commit a step without a rank that kept its peers waiting "
                        "this long in a collective, and replace it (default: off, wait)")
    p.add_argument("--max-restarts", type=_int, dest="max_restarts", metavar="N",
                   help="dp: a failure nobody injected that repeats the same way (the same "
                        "error, the run no further) is recovered N times in a row, then ends "
                        "the run with that error (default 3)")
    p.add_argument("--paradigm", choices=field_choices("paradigm"),
                   help="ps (parameter server) or dp (data parallel, allreduce)")
    p.add_argument("--ranks", type=_int, help="dp: data-parallel ranks N")
    p.add_argument("--elastic", choices=field_choices("elastic"),
                   help="dp: after a rank is lost keep the global batch, or the per-rank "
                        "batch (lr scaled)")
    p.add_argument("--allreduce-buckets", type=_int, dest="allreduce_buckets",
                   help="dp: gradient buckets, one allreduce each (default: buckets of "
                        "about 25 MB, as DDP's; allreduce:K failures strike before bucket K)")
    p.add_argument("--micro-batches", type=_int, dest="micro_batches",
                   help="dp: micro-batches per rank, one gradient call each (default 1)")
    p.add_argument("--device", help="dp, your own loop: where replicas compute: auto (a GPU "
                   "per local rank when CUDA is present, else the CPU), cpu, cuda, cuda:N")
    p.add_argument("--collective", choices=field_choices("collective"),
                   help="dp: auto (NCCL when each rank of a host has its own GPU, else "
                        "gloo), gloo or nccl")
    p.add_argument("--sync-every", type=_int, dest="sync_every", metavar="H",
                   help="dp, localsgd/diloco/streaming-diloco: inner steps between two outer "
                        "steps (default 10)")
    p.add_argument("--sync-fragments", type=_int, dest="sync_fragments", metavar="F",
                   help="streaming-diloco: fragments, each synchronized on its own "
                        "staggered schedule (default 2)")
    p.add_argument("--shards", type=_int, help="parameter-server shards K")
    p.add_argument("--workers", type=_int, help="workers N")
    p.add_argument("--consistency", choices=field_choices("consistency"),
                   help="bsp, ssp (sim) or async (ray)")
    p.add_argument("--staleness", type=_int, help="SSP staleness bound s")
    p.add_argument("--fail", action="append", default=None,
                   help="failure spec, repeatable (e.g. 'shards=50%%@iter=230'). iter=N counts "
                        "executed iterations (replays after a rollback included) on every "
                        "engine; time=T and mtbf=Ts are simulated seconds on sim and wall "
                        "seconds since training started on ray and gloo; mtbf=Niter counts "
                        "executed iterations")
    p.add_argument("--seed", type=_int)
    p.add_argument("--checkpoint-every", type=_int, dest="checkpoint_every")
    p.add_argument("--checkpoint-keep", type=_int, dest="checkpoint_keep")
    p.add_argument("--checkpoint-fraction", type=_float, dest="checkpoint_fraction",
                   help="prioritized checkpoints: fraction r saved every r*N iterations")
    p.add_argument("--checkpoint-rule", dest="checkpoint_rule",
                   choices=field_choices("checkpoint_rule"))
    p.add_argument("--checkpoint-dir", dest="checkpoint_dir", help="path or fsspec URL")
    p.add_argument("--checkpoint-shared", action="store_true", default=None,
                   dest="checkpoint_shared",
                   help="with --ray-address: --checkpoint-dir is a folder every host of the "
                        "cluster mounts (a checkpoint-restart restores from it on any host)")
    p.add_argument("--max-iterations", type=_int, dest="max_iterations")
    p.add_argument("--eval-every", type=_int, dest="eval_every",
                   help="evaluate every N executed iterations (the curve), plus the "
                        "iteration a failure strikes and a few after it; iterations to "
                        "target (and rework) are exact to one iteration whatever N is: "
                        "copies kept in between are scored when the target is reached")
    p.add_argument("--target", type=_float, help="convergence target (default: workload's)")
    p.add_argument("--lr", type=_float, help="server step size override")
    p.add_argument("--option", action="append", default=[], type=_kv, metavar="KEY=VALUE",
                   help="workload option, repeatable (e.g. batch_size=64)")
    p.add_argument("--baseline", action="store_true", default=None,
                   help="also run failure-free with the same seed and report rework cost")
    p.add_argument("--out", type=Path, help="run folder (default runs/<time>-<name>)")
    reuse = p.add_mutually_exclusive_group()
    reuse.add_argument("--overwrite", action="store_true",
                       help="replace the run already in --out: only the files a run writes "
                            "and that run's own checkpoints go; other files stay")
    reuse.add_argument("--resume", action="store_true",
                       help="continue the interrupted or failed run in --out from its newest "
                            "checkpoint, as recorded in its config.toml (other options must "
                            "match it, but --max-iterations, a new budget; engines: sim)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_compare(sub: Any) -> None:
    from trainthrough.lab.suites import SUITES

    p = sub.add_parser("compare", help="run a suite and write results.csv, reports, plots")
    p.add_argument("--suite", default="core",
                   help=f"one of: {', '.join(SUITES)}; or your own by reference, "
                        "path/to/file.py:function or package.module:function returning a "
                        "SuiteSpec (see examples/my_model.py)")
    p.add_argument("--quick", action="store_true", help="the small form of the suite")
    p.add_argument("--seeds", type=_int, help="seeds per cell (default: the suite's)")
    p.add_argument("--option", action="append", default=[], type=_kv, metavar="KEY=VALUE",
                   help="a suite's own parameter, repeatable (scale: mttf_hours, sizes, "
                        "state_gb, ...; docs/scale-suite.md)")
    p.add_argument("--out", type=Path, help="suite folder (default runs/<time>-<suite>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


#: The run fields ``advise`` takes as flags (the workload, where and how big; never a
#: strategy or failures: it weighs every strategy against its own failure rate).
ADVISE_FIELDS = ("workload", "engine", "paradigm", "consistency", "shards", "workers",
                 "ranks", "sync_every", "seed", "target", "max_iterations", "ray_address",
                 "recovery_delay")


def _add_advise(sub: Any) -> None:
    p = sub.add_parser("advise", help="recommend a strategy and its checkpoint interval for "
                                      "a workload, an engine and a failure rate")
    p.add_argument("--config", type=Path,
                   help="a config.toml for the workload, sizes and [cost] (its strategy and "
                        "failures are not used: every strategy is weighed)")
    p.add_argument("--workload", help="workload name or FILE.py:FACTORY")
    p.add_argument("--option", action="append", default=[], type=_kv, metavar="KEY=VALUE",
                   help="workload option, repeatable")
    p.add_argument("--engine", help="engine to calibrate and predict on: sim or ray")
    p.add_argument("--ray-address", dest="ray_address", help="join this Ray cluster")
    p.add_argument("--recovery-delay", type=_float, dest="recovery_delay",
                   help="seconds a lost shard stays down (ray)")
    p.add_argument("--paradigm", choices=field_choices("paradigm"),
                   help="ps: predicted from calibration runs; dp: every strategy, "
                        "synchronous and relaxed, measured at the failure rate")
    p.add_argument("--ranks", type=_int, help="data-parallel ranks (dp)")
    p.add_argument("--sync-every", type=_int, dest="sync_every",
                   help="inner steps between outer steps of the relaxed candidates (dp)")
    p.add_argument("--consistency", choices=field_choices("consistency"))
    p.add_argument("--shards", type=_int)
    p.add_argument("--workers", type=_int)
    p.add_argument("--seed", type=_int)
    p.add_argument("--target", type=_float)
    p.add_argument("--max-iterations", type=_int, dest="max_iterations")
    p.add_argument("--mtbf", help="mean time between failures with a unit (e.g. 30s, 2min): "
                                  "one random shard (dp: rank) fails each time; simulated "
                                  "seconds on sim, wall seconds on real engines")
    p.add_argument("--fail", help="or the failures as a spec with an mtbf= trigger, e.g. "
                                  "'shards=50%%@mtbf=30s', or a recorded trace: failures "
                                  "of one kind at times, e.g. "
                                  "'shard=any@time=4s;shard=any@time=9.5s'")
    p.add_argument("--trace", type=Path,
                   help="or the trace from a file: one failure per line in that form "
                        "(# starts a comment)")
    p.add_argument("--strategies", help="weigh only these presets (comma-separated; default: "
                                        "every preset the engine runs for the paradigm)")
    p.add_argument("--calibration-seeds", dest="calibration_seeds", type=_int, default=1,
                   help="repeat the failure-free and failure runs on this many seeds and "
                        "average (default 1; more where iterations to target vary by seed)")
    p.add_argument("--rank-by", dest="rank_by", choices=("time", "cost"), default="time",
                   help="rank by predicted time to target (default) or on-demand cloud cost")
    p.add_argument("--out", type=Path,
                   help="folder for advice.md, advice.png, advice.json (default "
                        "runs/<time>-advise-<workload>; must not exist or be empty)")
    p.add_argument("--quiet", action="store_true", help="no calibration progress lines")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainthrough",
                     description="Train through failures and measure what recovery costs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub)
    lp = sub.add_parser("list", help="list workloads, strategies, engines and suites")
    lp.add_argument("--engines", action="store_true",
                    help="print what each engine runs (the capability matrix)")
    _add_compare(sub)
    _add_advise(sub)
    rp = sub.add_parser("release", help="end the warm actors runs kept on a Ray cluster "
                                        "(--keep-warm)")
    rp.add_argument("--ray-address", dest="ray_address", required=True,
                    help="the cluster (host:port)")
    return parser


def _overrides(args: argparse.Namespace, cfg: RunConfig) -> dict[str, Any]:
    """The config fields the command line sets, on top of ``cfg``."""
    from trainthrough.config import FLAG_FIELDS
    from trainthrough.workloads.options import parse_option

    over = {k: getattr(args, k) for k in FLAG_FIELDS if getattr(args, k) is not None}
    if args.fail is not None:
        over["failures"] = args.fail
    if args.option:
        workload = over.get("workload", cfg.workload)
        over["workload_options"] = {**cfg.workload_options, **{
            k: parse_option(workload, k, v) for k, v in args.option}}
    return over


def _named(args: argparse.Namespace, flags: tuple[str, ...]) -> set[str]:
    """The fields among ``flags`` the command line names (every flag defaults to None)."""
    return {k for k in flags if getattr(args, k) is not None}


def _resume_config(args: argparse.Namespace) -> tuple[RunConfig, str]:
    """The recorded config and id of the run ``--resume`` continues.

    What may differ from the recorded config (:data:`trainthrough.lab.resume.FREE_ON_RESUME`):
    ``--max-iterations`` (the run goes on to the new budget), ``--wall-limit`` and
    ``--fail`` (this part's own); an option left out keeps the recorded value.

    Raises:
        UserError: no ``--out``, a ``--config``, any other option that differs from the
            recorded config, or nothing to resume in ``--out`` (lab/run_folder.py).
    """
    from trainthrough.config import flag_label
    from trainthrough.lab.resume import conflict, resumed_config
    from trainthrough.lab.run_folder import resume_point

    if args.out is None:
        raise UserError("--resume needs --out, the folder of the run to continue")
    if args.config is not None:
        raise UserError(f"--resume reads {args.out / 'config.toml'}; drop --config")
    point = resume_point(args.out)
    recorded = point.config
    asked = replace(recorded, **_overrides(args, recorded))
    bad = conflict(recorded, asked)
    if bad is not None:
        raise UserError(
            f"--resume continues the run as recorded in {args.out / 'config.toml'}, "
            f"where {flag_label(bad.setting)} is {bad.recorded!r}, not {bad.asked!r}; drop "
            "the option, or start a new run (--overwrite)")
    return resumed_config(recorded, asked), point.run_id


def _slug(name: str) -> str:
    """``name`` as one folder-name part: a reference by its file or module name
    (``examples/my_model.py:build`` -> ``my_model``), path separators replaced."""
    where, colon, _ = name.rpartition(":")
    if colon and where:
        name = Path(where).stem if where.endswith(".py") else where.rpartition(".")[2]
    return name.replace("/", "-").replace(":", "-").replace(" ", "-") or "run"


def _cmd_run(args: argparse.Namespace) -> int:
    from trainthrough.config import FLAG_FIELDS, RunConfig
    from trainthrough.lab.progress import RunProgress, SaveWarnings, console, make_progress
    from trainthrough.lab.runner import run
    from trainthrough.lab.validate import validate_run

    run_id = None
    if args.resume:
        cfg, run_id = _resume_config(args)
    else:
        cfg = RunConfig.from_toml(args.config) if args.config else RunConfig()
        cfg = replace(cfg, **_overrides(args, cfg))
    validate_run(cfg, named=_named(args, FLAG_FIELDS))
    out = args.out = args.out or Path("runs") / (
        f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(cfg.workload)}-{_slug(cfg.strategy)}")
    with make_progress(args.quiet) as progress:
        bar = RunProgress(progress, f"{cfg.workload}/{cfg.strategy}", cfg.max_iterations or 1000)
        summary = run(cfg, out, [bar, SaveWarnings()], run_id=run_id,
                      overwrite=args.overwrite, resume=args.resume)
    r = summary.result
    if not args.quiet:
        rework = summary.rework.rework_iterations
        # Said only when some were lost (the parameter server on Ray counts them).
        lost = r.extras.get("acknowledged_lost")
        # None: no evaluation finished (a run stopped by its wall limit before one).
        metric = "n/a" if r.final_metric is None else f"{r.final_metric:.4g}"
        console.print(
            f"{r.workload} / {r.strategy}: converged={r.converged} "
            f"iterations={r.iterations} to_target={r.iterations_to_target} "
            f"failures={r.failures} rework={rework if rework is not None else 'n/a'} "
            f"{f'acknowledged_lost={lost} ' if lost else ''}"
            f"{r.metric_name}={metric} sim={r.sim_seconds:.1f}s "
            f"wall={r.wall_seconds:.1f}s -> {out}")
    if not r.converged and r.target is not None:
        print(f"trainthrough: run did not reach the target {r.target} within "
              f"{r.iterations} iterations (see {out}/metrics.jsonl)", file=sys.stderr)
    return 0


def _cmd_list(engines_matrix: bool = False) -> int:
    from trainthrough.engines import registry
    from trainthrough.ft.strategy import PRESETS
    from trainthrough.lab.suites import SUITES
    from trainthrough.workloads import WORKLOADS

    if engines_matrix:
        from trainthrough.engines.matrix import matrix_lines

        print("\n".join(matrix_lines()))
        return 0
    from trainthrough.workloads.reference import installed

    mine = {k: f"installed: {v}" for k, v in installed().items()}
    for title, items in (("workloads", {**{k: v[1] for k, v in WORKLOADS.items()}, **mine,
                                        "FILE.py:FACTORY": "your own, by reference (also "
                                        "package.module:factory)"}),
                         ("strategies", {k: f"[{'/'.join(v.paradigms)}] {v.description}"
                                         for k, v in PRESETS.items()}),
                         ("engines", {n: registry.entry(n).description
                                      for n in registry.names()}),
                         ("suites", {k: v.description for k, v in SUITES.items()})):
        print(f"{title}:")
        for name, desc in items.items():
            print(f"  {name:<22} {desc}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from trainthrough.lab.suite import run_suite
    from trainthrough.lab.suites import build_suite

    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds must be at least 1 (got {args.seeds})")
    options: dict[str, str] = {}
    for k, v in args.option:
        if k in options:
            raise UserError(f"--option {k} is given twice")
        options[k] = v
    spec = build_suite(args.suite, quick=args.quick, seeds=args.seeds, options=options)
    out = args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(spec.name)}"
    table = run_suite(spec, out, quiet=args.quiet)
    print(table)
    print(f"\nreport: {out / 'report.md'}  html: {out / 'report.html'}  csv: {out / 'results.csv'}")
    return 0


def _cmd_advise(args: argparse.Namespace) -> int:
    from trainthrough.config import RunConfig
    from trainthrough.lab.advise import advise, trace_spec
    from trainthrough.lab.advise.report import check_out, table_text, write
    from trainthrough.workloads.options import parse_option

    cfg = RunConfig.from_toml(args.config) if args.config else RunConfig()
    if args.config and (cfg.failures or cfg.baseline):
        print(f"trainthrough: note: advise ignores the failures and baseline of "
              f"{args.config}; it uses --mtbf, --fail or --trace", file=sys.stderr)
    over = {k: getattr(args, k) for k in ADVISE_FIELDS if getattr(args, k) is not None}
    if args.option:
        workload = over.get("workload", cfg.workload)
        over["workload_options"] = {**cfg.workload_options, **{
            k: parse_option(workload, k, v) for k, v in args.option}}
    cfg = replace(cfg, **over)
    fail = args.fail
    if args.trace is not None:
        if fail is not None:
            raise UserError("give the failures once: --fail or --trace, not both")
        fail = _read_trace(args.trace)
    trace = trace_spec(cfg.paradigm, args.mtbf, fail,
                       note=lambda m: print(f"trainthrough: note: {m}", file=sys.stderr))
    only = None
    if args.strategies is not None:
        only = [n.strip() for n in args.strategies.split(",") if n.strip()]
        if not only:
            raise UserError("--strategies needs at least one preset name")
    out = args.out or Path("runs") / (f"{time.strftime('%Y%m%d-%H%M%S')}-advise-"
                                      f"{_slug(cfg.workload)}")
    check_out(out)  # before minutes of calibration
    say = (lambda m: None) if args.quiet else (
        lambda m: print(f"calibrating: {m}", file=sys.stderr, flush=True))
    named = _named(args, ADVISE_FIELDS)
    if cfg.paradigm == "dp":
        return _advise_dp(cfg, trace, only, args, out, say, named)
    a = advise(cfg, trace, only=only, rank_by=args.rank_by, say=say,
               seeds=args.calibration_seeds, named=named)
    write(a, out)
    print(table_text(a))
    print(f"\nadvice: {out / 'advice.md'}  plot: {out / 'advice.png'}  json: "
          f"{out / 'advice.json'}")
    return 0


def _advise_dp(cfg: Any, trace: Any, only: list[str] | None, args: argparse.Namespace,
               out: Path, say: Any, named: set[str]) -> int:
    """``advise --paradigm dp``: every candidate measured at the rate (lab/advise/measured.py)."""
    from trainthrough.lab.advise import measured_report
    from trainthrough.lab.advise.measured import advise_dp

    if args.rank_by != "time":
        raise UserError("--rank-by cost is for parameter-server advice; data-parallel "
                        "advice ranks by measured time to target")
    a = advise_dp(cfg, trace, only=only, say=say, seeds=args.calibration_seeds, named=named)
    measured_report.write(a, out)
    print(measured_report.table_text(a))
    print(f"\nadvice: {out / 'advice.md'}  plot: {out / 'advice.png'}  json: "
          f"{out / 'advice.json'}")
    return 0


def _read_trace(path: Path) -> str:
    """A trace file's failures, ``;``-joined as --fail takes them."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--trace {path}: cannot read it ({type(e).__name__}: "
                        f"{getattr(e, 'strerror', None) or e})") from None
    specs = [line.split("#", 1)[0].strip() for line in lines]
    text = ";".join(x for x in specs if x)
    if not text:
        raise UserError(f"--trace {path}: no failure in it (one per line, e.g. "
                        "'shard=any@time=4s')")
    return text


def _cmd_release(address: str) -> int:
    from trainthrough.engines.ray.runtime import ensure_ray, shutdown_ray

    ensure_ray(address)  # Ray missing or the cluster unreachable: one line, exit 2
    try:
        from trainthrough.engines.ray.driver.warm import release

        print(release(address))
    finally:
        shutdown_ray()
    return 0


_TERMINATED: list[bool] = []  # set by the handler: Ray may re-raise it as KeyboardInterrupt


def _on_sigterm(signum: int, frame: object) -> None:
    _TERMINATED.append(True)
    interrupt(Terminated())


def _on_sigint(signum: int, frame: object) -> None:
    interrupt(KeyboardInterrupt())


def _left_behind(args: argparse.Namespace | None) -> str:
    """What an interrupted command left on disk, as its folder says."""
    if args is None or args.command in ("list", "release"):
        return "nothing was written"
    if args.command == "compare":
        return "the suite folder has no report"
    if args.command == "advise":
        return "no advice folder was written"
    import json

    out = args.out
    try:  # plain reading: the interruption may have come in the middle of an import
        state = json.loads((out / "status.json").read_text()).get("state") if out else None
    except (OSError, ValueError, AttributeError):
        state = None
    if state != "interrupted":
        return "no run folder was written"
    return (f"{out} is marked interrupted (no summary.json); "
            f"`trainthrough run --out {out} --resume` continues it")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trainthrough`` command; returns the exit code."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    args = None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "list":
            return _cmd_list(args.engines)
        if args.command == "advise":
            return _cmd_advise(args)
        if args.command == "release":
            return _cmd_release(args.ray_address)
        return _cmd_compare(args)
    except UserError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"trainthrough: error: {msg}", file=sys.stderr)
        return 2
    except RunStalled as e:  # the run folder says so too (status.json: failed, reason)
        print(f"trainthrough: run failed: {reason(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (``trainthrough list | head``): stop quietly. Python would
        # otherwise report the failed flush of stdout at exit as well.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        term = terminated(e) or bool(_TERMINATED)
        how = "terminated" if term else "interrupted"
        print(f"trainthrough: {how}; {_left_behind(args)}", file=sys.stderr)
        return 143 if term else 130


if __name__ == "__main__":
    sys.exit(main())
