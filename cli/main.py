"""`koordstream` subcommands: up, worker, bridge, cluster up, broker, demo, bench, perf, sandbox, publish,
read, topics, config, schema.

Only argument parsing and printing live here; every action calls into streams/ or perf/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from streams.settings import Settings, SettingsError, load_settings

console = Console()


def _settings(args: argparse.Namespace) -> Settings:
    kafka: dict[str, Any] = {}
    worker: dict[str, Any] = {}
    if getattr(args, "bootstrap", None):
        kafka["bootstrap"] = args.bootstrap
    if getattr(args, "roles", None):
        worker["roles"] = args.roles
    return load_settings(getattr(args, "config", None), kafka=kafka, worker=worker)


def _broker_settings(args: argparse.Namespace, command: str) -> Settings | None:
    """The settings of a command that needs a running broker; None (and why, printed) without one."""
    settings = _settings(args)
    if not settings.kafka.bootstrap:
        console.print(f"[red]{command}: give --bootstrap HOST:PORT[/red]")
        return None
    return settings


def cmd_up(args: argparse.Namespace) -> int:
    from streams.supervisor import run_up

    return run_up(_settings(args), args.config)


def cmd_worker(args: argparse.Namespace) -> int:
    from streams.worker import run_worker

    settings = _settings(args)
    if not settings.kafka.bootstrap:
        console.print("[red]worker: give --bootstrap HOST:PORT (or KOORDSTREAM_KAFKA_BOOTSTRAP); "
                      "`koordstream up` starts an embedded broker[/red]")
        return 2
    run_worker(settings)
    return 0


def cmd_bridge(args: argparse.Namespace) -> int:
    from streams.worker import run_worker

    settings = _settings(args)
    bridge = {"kubeconfig": args.kubeconfig} if args.kubeconfig else {}
    settings = load_settings(getattr(args, "config", None), kafka={"bootstrap": settings.kafka.bootstrap},
                             worker={"roles": "bridge"}, bridge=bridge)
    if not settings.kafka.bootstrap:
        console.print("[red]bridge: give --bootstrap HOST:PORT (or KOORDSTREAM_KAFKA_BOOTSTRAP)[/red]")
        return 2
    run_worker(settings)
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    import tempfile

    from streams.kube_cluster import K8sNotInstalled, cluster_up

    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="koordstream-cluster-"))

    async def run() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await cluster_up(folder, args.nodes, not args.no_rbac, stopping)

    try:
        asyncio.run(run())
    except K8sNotInstalled as exc:
        console.print(f"[red]cluster up: {exc}[/red]")
        return 2
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    from streams.broker import EmbeddedBroker, wait_ready
    from streams.kafka_broker import KafkaBroker, KafkaNotInstalled

    broker: EmbeddedBroker | KafkaBroker
    if args.kafka:
        try:
            broker = KafkaBroker(log_dir=args.log_dir, port=args.port or None)
        except KafkaNotInstalled as exc:
            console.print(f"[red]broker: {exc}[/red]")
            return 2
        what = f"Apache Kafka broker (log in {broker.log_dir})"
    elif args.log_dir:
        console.print("[red]broker: --log-dir is for --kafka (the embedded broker keeps nothing on disk)[/red]")
        return 2
    else:
        broker = EmbeddedBroker(args.port)
        what = "embedded broker"
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        broker.start()
        asyncio.run(broker.ready() if isinstance(broker, KafkaBroker) else wait_ready(broker.bootstrap))
        print(f"{what} ready at {broker.bootstrap} (pid {broker.pid})", flush=True)
        while not stopping.is_set() and broker.proc is not None and broker.proc.poll() is None:
            stopping.wait(0.5)
    finally:
        if isinstance(broker, KafkaBroker):
            broker.close()  # stops it, and removes its log folder when that is a temporary one
        else:
            broker.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from perf.demo import DemoConfig, run_demo, succeeded

    settings = _settings(args)
    cfg = DemoConfig(nodes=args.nodes, pods=args.pods, rate=args.rate, bootstrap=settings.kafka.bootstrap,
                     layout=args.layout, seed=args.seed)
    console.print(f"koordstream demo: {cfg.nodes} nodes, {cfg.pods} pods at {cfg.rate:g} pods/s "
                  f"({'embedded broker' if not cfg.bootstrap else cfg.bootstrap})")
    summary = asyncio.run(run_demo(cfg, settings))
    table = Table(title="koordstream demo (independent checker)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    lat = summary["queue_latency_ms"]
    for name, value in [
        ("pods published", summary["pods_total"]),
        ("pods bound", summary["pods_bound"]),
        ("pods unschedulable", summary["pods_unschedulable"]),
        ("pods bound to two different nodes", summary["pods_double_bound"]),
        ("nodes over-committed", summary["nodes_overcommitted"]),
        ("throughput (pods/s)", summary["throughput_pods_per_s"]),
        ("queueing latency p50 / p90 / p99 (ms)", f"{lat['p50']} / {lat['p90']} / {lat['p99']}"),
        ("wall time, first pod -> last decision (s)", summary["wall_s"]),
        ("start-up: broker, topics, group join (s)", summary["startup_s"]),
    ]:
        table.add_row(name, str(value))
    console.print(table)
    _write_json(args, summary)
    ok = succeeded(summary)
    console.print("[green]OK: every pod bound, consistent[/green]" if ok else "[red]FAILED[/red]")
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import platform

    from perf.bench import BasicWorkload, run_basic_repeated

    w = BasicWorkload(nodes=args.nodes, init_pods=args.init_pods, pods=args.pods, identical=args.identical,
                      seed=args.seed, batch=args.batch, gc_threshold=args.gc_threshold,
                      profiles=Path(args.profiles).read_text() if args.profiles else "")
    result = run_basic_repeated(w, args.runs)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    table = Table(title=f"koordstream bench basic: {result['workload']} (median of {result['runs']})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    lat = result["attempt_latency_ms"]
    rows: list[tuple[str, Any]] = [
        ("nodes / init pods / measured pods", f"{w.nodes} / {w.init_pods} / {w.pods}"),
        ("pods placed", result["pods_placed"]),
        ("throughput (pods/s)", result["throughput_pods_per_s"]),
        ("throughput per run (pods/s)", ", ".join(str(x) for x in result["throughput_runs_pods_per_s"])),
        ("attempt latency p50 / p90 / p99 (ms)", f"{lat['p50']} / {lat['p90']} / {lat['p99']}"),
        ("nodes evaluated per pod", result["nodes_evaluated_per_pod"]),
        ("peak memory (MiB)", result["peak_memory_mib"]),
    ]
    if w.identical:
        rows += [("one by one, batching off (pods/s)", result["one_by_one_pods_per_s"]),
                 ("speedup of equivalence classes", result["speedup"])]
    rows += [(f"share: {name}", f"{share:.1%}") for name, share in result["plugin_share"].items()]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    _write_json(args, result)
    return 0 if result["pods_placed"] == w.pods else 1


def cmd_bench_codec(args: argparse.Namespace) -> int:
    from perf.codec_bench import run_codec

    result = run_codec(args.count, args.rounds)
    table = Table(title=f"koordstream bench codec: {args.count} records a message, median of {args.rounds} rounds")
    for col in ("kind", "encode us (one by one / batched)", "decode us", "bytes a record"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, f in result["kinds"].items():
        table.add_row(kind, f"{f['plain_encode']} / {f['batched_encode']}", f"{f['plain_decode']} / {f['batched_decode']}",
                      f"{f['plain_bytes']} / {f['batched_bytes']}")
    per_pod = result["codec_us_per_pod"]
    table.add_row("a pod's records", "", "", f"{per_pod['plain']} / {per_pod['batched']} us")
    console.print(table)
    _write_json(args, result)
    return 0


def cmd_bench_trace(args: argparse.Namespace) -> int:
    from perf.trace import POLICIES, bench_trace, parse_seeds

    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    try:
        result = bench_trace(args.nodes_csv, args.pods_csv, args.load, parse_seeds(args.seeds), policies,
                             limit=args.limit, workers=args.workers)
    except (OSError, ValueError) as exc:
        console.print(f"[red]bench trace: {exc}[/red]")
        return 2
    table = Table(title=f"GPU allocation ratio (%), load {args.load:g}, seeds {args.seeds} (mean)")
    for col in ("policy", "at 100% arrived", "final", "pods failed"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for policy, s in result["summary"].items():
        table.add_row(policy, f"{s['at_100_mean']:.2f}", f"{s['final_mean']:.2f}", f"{s['pods_failed_mean']:.1f}")
    console.print(table)
    _write_json(args, result)
    return 0


def cmd_bench_rebalance(args: argparse.Namespace) -> int:
    from perf.rebalance_bench import ImbalanceWorkload, ScaleDownWorkload, run

    result = run(ImbalanceWorkload(nodes=args.nodes, max_cycles=args.max_cycles),
                 ScaleDownWorkload(nodes=args.scale_down_nodes, replicas=args.replicas))
    table = Table(title="koordstream bench rebalance (in-process, ideal actuator)")
    for col in ("run", "std sum before -> after", "std max after", "evictions", "cycles", "plan s"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for mode, p in result["imbalance"]["planners"].items():
        table.add_row(f"imbalance: {mode}", f"{p['std_sum_before']} -> {p['std_sum_after']}", str(p["std_max_after"]),
                      str(p["evictions"]), str(p["cycles"]), str(p["plan_s"]))
    for name, r in result["scale_down"]["rankers"].items():
        table.add_row(f"scale-down: {name}", f"{r['empty_nodes']} nodes emptied", "", str(r["evictions"]), "",
                      str(r["plan_s"]))
    console.print(table)
    goals = {**result["imbalance"]["goals"], **result["scale_down"]["goals"]}
    console.print("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items()))
    _write_json(args, result)
    return 0


def cmd_perf_chaos(args: argparse.Namespace) -> int:
    from perf.chaos import ChaosConfig, run_chaos, succeeded

    cfg = ChaosConfig.preset(args.broker, args.quick, args.seed, run_dir=args.run_dir or "")
    return _run_and_print("chaos", lambda: run_chaos(cfg, _settings(args)), succeeded, args.json)


def _run_and_print(name: str, run: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
                   succeeded: Callable[[dict[str, Any]], bool], json_out: str | None) -> int:
    """Run a perf run that returns a JSON result: print it, write it to `json_out`; exit 0 when
    it `succeeded`, 1 when not, 2 when it could not run."""
    try:
        result = asyncio.run(run())
    except (ValueError, TimeoutError, OSError) as exc:
        console.print(f"[red]perf run {name}: {exc}[/red]")
        return 2
    console.print_json(json.dumps(result))
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if succeeded(result) else 1


def cmd_perf_soak(args: argparse.Namespace) -> int:
    from perf.soak import SoakConfig, run_soak

    cfg = SoakConfig.preset(args.broker, args.quick, args.seed)
    if args.pods:
        cfg = replace(cfg, pods=args.pods)
    if args.rate:
        cfg = replace(cfg, rate=args.rate)
    return _run_and_print("soak", lambda: run_soak(cfg, _settings(args)),
                          lambda r: not r["pods_double_bound"] and not r["nodes_overcommitted"], args.json)


def cmd_perf_rebalance_moves(args: argparse.Namespace) -> int:
    from perf.rebalance_run import MoveRunConfig, run_moves, succeeded

    cfg = MoveRunConfig(broker=args.broker)
    return _run_and_print("rebalance-moves", lambda: run_moves(cfg, _settings(args)), succeeded, args.json)


def cmd_perf_rebalance_scenario(args: argparse.Namespace) -> int:
    from perf import rebalance_scenarios as rs

    def consistent(r: dict[str, Any]) -> bool:
        return not r["pods_double_bound"] and not r["nodes_overcommitted"]

    if args.scenario == "rebalance-imbalance":
        imbalance = rs.ImbalanceRun.preset(args.broker, args.quick)
        return _run_and_print(args.scenario, lambda: rs.run_imbalance(imbalance, _settings(args)), consistent,
                              args.json)
    scale_down = rs.ScaleDownRun.preset(args.broker, args.quick)
    return _run_and_print(args.scenario, lambda: rs.run_scale_down(scale_down, _settings(args)), consistent, args.json)


def cmd_perf_sandbox(args: argparse.Namespace) -> int:
    from perf import sandbox_run as sr
    from perf.plots import write_sandbox_plots

    run: Callable[[], Coroutine[Any, Any, dict[str, Any]]]
    if args.scenario == "sandbox-warm" and args.kwok:
        from perf.kube_run import KwokOptions
        from perf.sandbox_kube import run_warm_kwok

        settings = _settings(args)
        options = KwokOptions(bootstrap=settings.kafka.bootstrap, broker=args.broker, concurrency=args.concurrency,
                              run_dir=args.run_dir or "")
        warm = sr.WarmRun.preset(args.broker, args.quick)
        run = lambda: run_warm_kwok(warm, settings, options)  # noqa: E731
    elif args.kwok:
        console.print(f"[red]perf run {args.scenario}: --kwok runs sandbox-warm, not {args.scenario}[/red]")
        return 2
    elif args.scenario == "sandbox-warm":
        warm = sr.WarmRun.preset(args.broker, args.quick)
        run = lambda: sr.run_warm(warm, _settings(args))  # noqa: E731
    else:
        churn = sr.ChurnRun.preset(args.broker, args.quick)
        run = lambda: sr.run_churn(churn, _settings(args))  # noqa: E731
    try:
        result = asyncio.run(run())
    except (ValueError, TimeoutError, OSError, RuntimeError) as exc:
        console.print(f"[red]perf run {args.scenario}: {exc}[/red]")
        return 2
    plots = [p.name for p in write_sandbox_plots(result, args.report)] if args.report else []
    _write_run(args, result, sr.report(result, plots))
    return 0 if sr.succeeded(result) else 1


def _write_json(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """A command's result as JSON into `--json`'s file, when given."""
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def _write_run(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    """Print a perf run's report; write its JSON (`--json`) and report.md (`--report`, beside its plots)."""
    console.print(text, markup=False)
    _write_json(args, result)
    if args.report:
        (Path(args.report) / "report.md").write_text(text)


def cmd_perf_run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if args.scenario in ("sandbox-warm", "sandbox-churn"):
        return cmd_perf_sandbox(args)
    if args.scenario == "rebalance-moves":
        return cmd_perf_rebalance_moves(args)
    if args.scenario in ("rebalance-imbalance", "scale-down-binpack"):
        return cmd_perf_rebalance_scenario(args)
    if args.scenario == "chaos":
        return cmd_perf_chaos(args)
    if args.scenario == "soak":
        return cmd_perf_soak(args)

    from perf import scenario
    from perf.run import RunOptions, report, run_scenario

    path = Path(args.scenario)
    if not path.suffix:
        path = Path(__file__).resolve().parents[1] / "perf" / "scenarios" / f"{args.scenario}.yaml"
    try:
        for flag, n in (("--schedulers", args.schedulers), ("--state-workers", args.state_workers)):
            if n < 1:
                raise ValueError(f"{flag}={n}: at least 1 process")
        s = scenario.load(path)
        s = s.quick() if args.quick else s
        if s.trace_load or args.nodes_csv or args.pods_csv:
            if not (args.nodes_csv and args.pods_csv):
                raise scenario.ScenarioError(str(path), "trace", None, "a trace scenario needs --nodes-csv and "
                                             "--pods-csv (Alibaba's cluster-trace-gpu-v2023 files)")
            s = scenario.with_trace(s, args.nodes_csv, args.pods_csv)
        if args.pods:
            s = s.scaled(args.pods)
        if args.rate:
            s = s.at_rate(args.rate)
        # A live bar on a terminal (nothing when the output is a file or a pipe).
        with Progress(TextColumn(f"{s.name}: pods bound"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task("bound", total=None)
            settings = _settings(args)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            if args.kwok:
                from perf.kube_run import KwokOptions, run_kwok, succeeded

                if args.floor or args.profile or (args.schedulers, args.state_workers) != (1, 1):
                    raise ValueError("--floor, --profile, --schedulers and --state-workers are of runs on the broker "
                                     "alone: not with --kwok")
                result = asyncio.run(run_kwok(s, settings, KwokOptions(
                    bootstrap=settings.kafka.bootstrap, broker=args.broker, concurrency=args.concurrency,
                    run_dir=args.run_dir or "", on_progress=progress)))
            else:
                result = asyncio.run(run_scenario(s, settings, RunOptions(
                    bootstrap=settings.kafka.bootstrap,  # empty: a broker of --broker's kind for the run
                    broker=args.broker,
                    floor=args.floor,
                    profile=args.profile or "",
                    replicas=(args.state_workers, args.schedulers),
                    on_progress=progress)))
    except (ValueError, TimeoutError, OSError, RuntimeError) as exc:  # ScenarioError, StageError, bad trace files
        console.print(f"[red]perf run: {exc}[/red]")
        return 2
    plots: list[str] = []
    if args.report:
        from perf.plots import write_plots

        plots = [p.name for p in write_plots(result, args.report)]
    _write_run(args, result, report(result, plots))
    ok = succeeded(result) if args.kwok else result["pods_double_bound"] == 0 and result["nodes_overcommitted"] == 0
    return 0 if ok else 1


def cmd_perf_compare(args: argparse.Namespace) -> int:
    from perf.run import compare

    try:
        baseline, new = (json.loads(Path(f).read_text()) for f in (args.baseline, args.new))
        rows, regressed = compare(baseline, new)
    except (OSError, ValueError, KeyError) as exc:
        console.print(f"[red]perf compare: {exc}[/red]")
        return 2
    table = Table(title=f"{baseline.get('scenario')}: baseline vs new")
    for col in ("figure", "baseline", "new", ""):
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(x) for x in row))
    console.print(table)
    return 1 if regressed else 0


def cmd_perf_model(args: argparse.Namespace) -> int:
    from perf.scale import model

    try:
        out = model(json.loads(Path(args.run).read_text()), args.cores, args.partitions)
    except (OSError, ValueError) as exc:  # ModelError, bad JSON
        console.print(f"[red]perf model: {exc}[/red]")
        return 2
    console.print(f"{out['scenario']}: CPU per pod (us) {out['costs_us_per_pod']}; "
                  f"ceiling as replicas grow {out['ceiling_pods_per_s']} pods/s")
    table = Table(title="the best split of the cores between the roles")
    for col in ("cores", "partitions", "scheduler replicas", "state workers", "pods/s", "broker cores"):
        table.add_column(col)
    for p in out["points"]:
        table.add_row(*(str(p[k]) for k in ("cores", "partitions", "schedulers", "state_workers", "pods_per_s",
                                             "broker_cores")))
    console.print(table)
    _write_json(args, out)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from streams.publish import publish_file

    settings = _broker_settings(args, "publish")
    if settings is None:
        return 2
    try:
        count = asyncio.run(publish_file(Path(args.file), args.topic, settings, raw=args.raw))
    except ValueError as exc:
        console.print(f"[red]publish: {exc}[/red]")
        return 1
    console.print(f"published {count} records to {args.topic}")
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from streams.reader import run_read

    settings = _broker_settings(args, "read")
    if settings is None:
        return 2
    run_read(settings, args.topic, args.from_beginning, args.limit, args.idle)
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from streams.catalogue import catalogue
    from streams.worker import prepare

    settings = _settings(args)
    table = Table(title="topic catalogue")
    for col in ("topic", "key", "partitions", "compacted", "what"):
        table.add_column(col)
    for spec in catalogue(settings.kafka.partitions, settings.kafka.app_id).values():
        table.add_row(spec.name, spec.key, str(spec.partitions), "yes" if spec.compacted else "", spec.doc)
    console.print(table)
    if args.create:
        if not settings.kafka.bootstrap:
            console.print("[red]topics --create: give --bootstrap HOST:PORT[/red]")
            return 2
        created = asyncio.run(prepare(settings))
        console.print(f"created: {', '.join(created) or 'nothing (all present)'}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from streams.settings import dump

    print(yaml.safe_dump(dump(_settings(args)), sort_keys=False), end="")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from schemas.jsonschema import write_schemas

    written = write_schemas(args.dir)
    console.print(f"wrote {len(written)} JSON Schema files to {args.dir}")
    return 0


def cmd_rebalance_plan(args: argparse.Namespace) -> int:
    from agents.rebalance import config as rebalance_config
    from agents.rebalance.rebalancer import budget_of, dry_run, from_manifests
    from agents.scheduler.framework import profiles
    from schemas.records import ScaleDownEvent
    from streams.connection import connect
    from streams.reader import read_cluster

    try:
        events = []
        for spec in args.scale_down:
            workload, _, count = spec.rpartition("=")
            namespace, _, name = workload.partition("/")
            if not namespace or not name or name.count("/") > 1 or not count.isdigit() or int(count) < 1:
                raise ValueError(f"--scale-down={spec!r}: expected NAMESPACE/NAME=N or NAMESPACE/KIND/NAME=N, N >= 1")
            events.append(ScaleDownEvent(workload=name, namespace=namespace, replicas=int(count)))
        config = rebalance_config.load(Path(args.rebalancer_config).read_text()) if args.rebalancer_config else None
        scheduler = profiles.load(Path(args.profiles).read_text()) if args.profiles else None
        if args.state:
            nodes, pods, budgets = from_manifests(Path(args.state).read_text())
        else:
            settings = _settings(args)
            if not settings.kafka.bootstrap:
                raise ValueError("give --state FILE or --bootstrap HOST:PORT")
            nodes, pods, pdbs = asyncio.run(read_cluster(connect(settings.kafka), settings.kafka.partitions))
            budgets = [budget_of(p) for p in pdbs]
        lines, result = dry_run(nodes, pods, config=config, scheduler=scheduler, scale_downs=events, budgets=budgets,
                                now=args.now if args.now is not None else time.time())
    except (ValueError, OSError) as exc:
        console.print(f"[red]rebalance plan: {exc}[/red]")
        return 2
    for line in lines:
        print(line)
    _write_json(args, result)
    return 0


def cmd_sandbox_claim(args: argparse.Namespace) -> int:
    from schemas.codec import encode
    from schemas.quantity import parse_duration
    from streams.sandbox_claims import claim_sandbox, make_claim, pairs

    settings = _broker_settings(args, "sandbox claim")
    if settings is None:
        return 2
    try:
        after = parse_duration(args.shutdown_after) if args.shutdown_after else None
    except ValueError:
        console.print(f"[red]sandbox claim: --shutdown-after {args.shutdown_after!r}: expected a duration like 90s, "
                      "10m or 1h30m[/red]")
        return 2
    try:
        claim = make_claim(args.pool, args.namespace, args.name, pairs(args.env, "--env"), pairs(args.label, "--label"),
                           after)
        answer = asyncio.run(claim_sandbox(settings, claim, args.timeout))
    except ValueError as exc:
        console.print(f"[red]sandbox claim: {exc}[/red]")
        return 2
    s = answer.status
    if args.json and s is not None:
        print(encode(s).decode())
    if answer.ready and s is not None:
        console.print(f"sandbox {s.sandbox} on node {s.node} (path {s.path}, pod {s.pod_uid}): "
                      f"ready in {answer.latency_ms:.0f} ms", highlight=False)
        return 0
    if s is not None and s.phase == "Refused":
        console.print(f"[red]refused[/red]: {s.reason}: {s.message}", highlight=False)
        retry = f" (retry after {s.retry_after_s:g} s)" if s.retry_after_s is not None else ""
        console.print(f"next step: {s.next_step or 'none'}{retry}", highlight=False)
        for alt in s.alternatives:
            changes = ", ".join(f"{k}={v}" for k, v in alt.changes.items())
            console.print(f"  alternative {alt.kind}: {alt.description}" + (f" ({changes})" if changes else ""),
                          highlight=False)
        return 1
    last = f"; last answer: {s.phase} ({s.path or '-'}, sandbox {s.sandbox or '-'}): {s.message}" if s else ""
    console.print(f"[red]no answer within {args.timeout:g} s[/red] for claim {claim.namespace}/{answer.claim.name}"
                  f"{last}: are the state workers running, and does pool {args.pool!r} exist?", highlight=False)
    return 1


def cmd_sandbox_pools(args: argparse.Namespace) -> int:
    from streams.sandbox_claims import pool_statuses

    settings = _broker_settings(args, "sandbox pools")
    if settings is None:
        return 2
    try:
        statuses = asyncio.run(pool_statuses(settings))
    except ValueError as exc:
        console.print(f"[red]sandbox pools: {exc}[/red]")
        return 2
    table = Table(title="warm pools (latest SandboxPoolStatus)")
    columns = ("pool", "replicas", "ready", "starting", "claimed", "claims", "warm hits", "starting hits", "cold",
               "refused", "reserved", "message")
    for col in columns:
        table.add_column(col, justify="left" if col in ("pool", "message") else "right")
    for st in statuses:
        table.add_row(f"{st.namespace}/{st.name}", *(str(v) for v in (
            st.replicas, st.ready, st.starting, st.claimed, st.claims, st.warm_hits, st.starting_hits, st.cold,
            st.refused, st.reserved)), st.message)
    console.print(table)
    if not statuses:
        console.print("no pool has reported yet")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="koordstream", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT (default: embedded broker where possible)")
        sp.add_argument("--config", help="settings YAML (sections kafka, scheduling, worker, rebalancer, bridge, sandbox)")

    roles = "comma-separated: scheduler, state, rebalancer, bridge (default: scheduler,state)"
    sp = sub.add_parser("up", help="embedded broker (unless --bootstrap), topics, all agents in one worker")
    common(sp)
    sp.add_argument("--roles", help=roles)
    sp.set_defaults(fn=cmd_up)
    sp = sub.add_parser("worker", help="the agents only, against --bootstrap")
    common(sp)
    sp.add_argument("--roles", help=roles)
    sp.set_defaults(fn=cmd_worker)
    sp = sub.add_parser("bridge", help="the Kubernetes bridge: the API server's pods and nodes into the topics, "
                                       "koordstream's bindings, evictions and feedback into API calls")
    common(sp)
    sp.add_argument("--kubeconfig", help="kubeconfig of the API server (default: $KUBECONFIG, ~/.kube/config; "
                                         "in-cluster: the pod's service account)")
    sp.set_defaults(fn=cmd_bridge)
    sp = sub.add_parser("cluster", help="a local Kubernetes control plane for trying koordstream")
    csub = sp.add_subparsers(dest="cluster_command", required=True)
    cu = csub.add_parser("up", help="etcd, kube-apiserver and Kwok (`make k8s`) on loopback, in the foreground")
    cu.add_argument("--dir", help="folder for its data, certificates, kubeconfigs and logs (default: a new "
                                  "temporary folder)")
    cu.add_argument("--nodes", type=int, default=10, help="Kwok nodes to create (32 cpu, 256Gi each)")
    cu.add_argument("--no-rbac", action="store_true", help="AlwaysAllow authorization instead of RBAC")
    cu.set_defaults(fn=cmd_cluster_up)
    sp = sub.add_parser("broker", help="run a broker in the foreground: the embedded Tansu, or Apache Kafka")
    sp.add_argument("--port", type=int, default=0, help="listen on this port (default: a free one)")
    sp.add_argument("--kafka", action="store_true",
                    help="Apache Kafka (single KRaft node; `make kafka` fetches it) instead of the embedded Tansu")
    sp.add_argument("--log-dir", help="with --kafka: the folder of its log, kept across restarts "
                                      "(default: a temporary folder, removed on exit)")
    sp.set_defaults(fn=cmd_broker)
    sp = sub.add_parser("demo", help="end-to-end run with an independent consistency check")
    common(sp)
    sp.add_argument("--nodes", type=int, default=1000)
    sp.add_argument("--pods", type=int, default=10000)
    sp.add_argument("--rate", type=float, default=2000.0, help="pods per second")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--layout", choices=("split", "single"), default="split",
                    help="split: a scheduler process and a state-agents process (default); single: one worker")
    sp.add_argument("--json", help="write the summary as JSON to this file")
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser("bench", help="in-process benchmarks of the scheduling core (no broker)")
    bsub = sp.add_subparsers(dest="bench_command", required=True)
    b = bsub.add_parser("basic", help="SchedulingBasic-like: N nodes, init pods, measured pods")
    b.add_argument("--nodes", type=int, default=5000)
    b.add_argument("--init-pods", type=int, default=1000)
    b.add_argument("--pods", type=int, default=10000)
    b.add_argument("--identical", action="store_true", help="one pod template (the equivalence-class path)")
    b.add_argument("--seed", type=int, default=42)
    b.add_argument("--batch", type=int, default=1000, help="pods per scheduling micro-batch")
    b.add_argument("--runs", type=int, default=3, help="repeat and report the median run")
    b.add_argument("--profiles", help="scheduler profiles YAML (default: the default profile)")
    b.add_argument("--gc-threshold", type=int, default=50_000,
                   help="young-generation GC threshold, as worker.gc_threshold (0: Python's default)")
    b.add_argument("--json", help="write the result as JSON to this file")
    b.set_defaults(fn=cmd_bench)
    t = bsub.add_parser("trace", help="replay the Alibaba GPU trace with GPU-placement policies (FGD and baselines)")
    t.add_argument("--nodes-csv", required=True, help="node list (sn,cpu_milli,memory_mib,gpu,model)")
    t.add_argument("--pods-csv", required=True, help="pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    t.add_argument("--load", type=float, default=1.3, help="inflate the GPU request to this share of capacity")
    t.add_argument("--seeds", default="42-51", help="a range like 42-51 or a list like 1,2,3")
    t.add_argument("--policy", default="all", help="FGD, BestFit, GpuPacking, GpuClustering, DotProduct, Random, or all")
    t.add_argument("--limit", type=int, default=0, help="use only the first N pods of the file (by name)")
    t.add_argument("--workers", type=int, default=2, help="processes to run seeds and policies in")
    t.add_argument("--json", help="write the results as JSON to this file")
    t.set_defaults(fn=cmd_bench_trace)
    c = bsub.add_parser("codec", help="a record's encode, decode and bytes, one by one and as Batches")
    c.add_argument("--count", type=int, default=500, help="records a message")
    c.add_argument("--rounds", type=int, default=30, help="rounds (the median is reported)")
    c.add_argument("--json", help="write the result as JSON to this file")
    c.set_defaults(fn=cmd_bench_codec)
    rb = bsub.add_parser("rebalance", help="the rebalancer's planners from the same start (imbalance, scale-down)")
    rb.add_argument("--nodes", type=int, default=500, help="imbalance: nodes (20 pods each)")
    rb.add_argument("--max-cycles", type=int, default=200, help="imbalance: cycles at most per planner")
    rb.add_argument("--scale-down-nodes", type=int, default=200, help="scale-down: nodes")
    rb.add_argument("--replicas", type=int, default=1000, help="scale-down: the web workload's replicas (halved)")
    rb.add_argument("--json", help="write the result as JSON to this file")
    rb.set_defaults(fn=cmd_bench_rebalance)
    sp = sub.add_parser("perf", help="scenarios through the real system (broker, agents, Kwok-compatible lifecycle)")
    psub = sp.add_subparsers(dest="perf_command", required=True)
    r = psub.add_parser("run", help="run a scenario (a name in perf/scenarios, or a YAML file)")
    common(r)
    r.add_argument("scenario")
    r.add_argument("--quick", action="store_true", help="the scenario's shrunk variant")
    r.add_argument("--json", help="write the result as JSON to this file")
    r.add_argument("--report", help="write report.md and the PNG plots into this directory")
    r.add_argument("--nodes-csv", help="a trace scenario's node list (alibaba: openb_node_list_gpu_node.csv)")
    r.add_argument("--pods-csv", help="a trace scenario's pod list (alibaba: openb_pod_list_default.csv)")
    r.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                   help="the broker a run starts: the embedded Tansu, or Apache Kafka (`make kafka`)")
    r.add_argument("--floor", action="store_true",
                   help="also measure the protocol's floor: the same pods through the commit protocol's records "
                        "with no decisions (the most a run can reach against the no-op limit)")
    r.add_argument("--schedulers", type=int, default=1, metavar="N",
                   help="scheduler replicas, each a process (at most the partition count does work)")
    r.add_argument("--state-workers", type=int, default=1, metavar="N",
                   help="state worker processes (owners, deciders, warm pools), sharing the partitions")
    r.add_argument("--profile", metavar="DIR",
                   help="py-spy on every worker while the pods flow: collapsed stacks and a flame graph per worker "
                        "into DIR, and the workers' CPU per pod by stage in the result")
    r.add_argument("--kwok", action="store_true",
                   help="through the real kube-apiserver and Kwok (`make k8s`), the bridge in between: pods and nodes "
                        "(sandbox-warm: its pools and claims) created through the API, measured from the API server's "
                        "side")
    r.add_argument("--concurrency", type=int, default=64, help="--kwok: creations in flight at once")
    r.add_argument("--seed", type=int, default=1, help="chaos and soak: the seed of the workload (and of the kills)")
    r.add_argument("--run-dir", help="chaos: where the broker's log and the workers' logs go; --kwok: where the "
                                     "control plane's data and the logs go (kept)")
    r.add_argument("--pods", type=int, default=0,
                   help="a scenario: scaled down to this many pods, its node pools with it; "
                        "soak: measured pods (default 500,000; --quick 6,000)")
    r.add_argument("--rate", type=float, default=0.0,
                   help="a scenario: its pods' arrival rate instead of its own; "
                        "soak: offered pods per second (default 1,000; --quick 100)")
    r.set_defaults(fn=cmd_perf_run)
    c = psub.add_parser("compare", help="compare a run with a baseline; exits 1 on a regression")
    c.add_argument("baseline")
    c.add_argument("new")
    c.set_defaults(fn=cmd_perf_compare)
    m = psub.add_parser("model", help="what more cores would give, from a profiled run's CPU per pod by stage")
    m.add_argument("run", help="a `perf run --profile` result (JSON)")
    m.add_argument("--cores", type=int, nargs="+", default=[2, 4, 16, 64], help="worker core counts to model")
    m.add_argument("--partitions", type=int, default=0, help="partitions of every topic (default: as many as cores)")
    m.add_argument("--json", help="write the model as JSON to this file")
    m.set_defaults(fn=cmd_perf_model)
    sp = sub.add_parser("rebalance", help="the rebalancer (FragmentationAware, ScaleDownBinPack)")
    rsub = sp.add_subparsers(dest="rebalance_command", required=True)
    rp = rsub.add_parser("plan", help="print a dry-run plan (moves, or ranks on a scale-down) without acting")
    source = rp.add_mutually_exclusive_group(required=True)
    source.add_argument("--state", help="Kubernetes manifests (YAML or JSON): the nodes, and the pods with their nodeName")
    source.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT: read nodes, pods and bindings from the topics")
    rp.add_argument("--rebalancer", dest="rebalancer_config",
                    help="a DeschedulerConfiguration-like YAML (default: FragmentationAware, global mode)")
    rp.add_argument("--config", help="settings YAML (sections kafka, scheduling, worker, rebalancer, bridge, sandbox), with --bootstrap")
    rp.add_argument("--profiles", help="the scheduler profiles YAML that destinations are simulated with")
    rp.add_argument("--scale-down", action="append", default=[], metavar="NAMESPACE/NAME=N",
                    help="also rank the pods of this workload (its controller's name, or KIND/NAME) to lose N replicas")
    rp.add_argument("--now", type=float, help="the time of the plan, unix seconds (default: now; pod ages count from it)")
    rp.add_argument("--json", help="write the plan as JSON to this file")
    rp.set_defaults(fn=cmd_rebalance_plan)
    sp = sub.add_parser("sandbox", help="warm pools of sandboxes: claim one, show the pools")
    ssub = sp.add_subparsers(dest="sandbox_command", required=True)
    sc = ssub.add_parser("claim", help="publish a SandboxClaim on POOL and print the answer (exit 1: refused or "
                                       "no answer in time)")
    common(sc)
    sc.add_argument("pool", help="the SandboxWarmPool's name")
    sc.add_argument("--namespace", default="default", help="the claim's (and the pool's) namespace")
    sc.add_argument("--name", default="", help="the claim's name (default: the pool's name and a random suffix)")
    sc.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="an environment variable to inject (as the template's envVarsInjectionPolicy allows)")
    sc.add_argument("--label", action="append", default=[], metavar="K=V", help="a label for the sandbox's pod")
    sc.add_argument("--shutdown-after", help="end the sandbox this long after the claim (a duration: 90s, 10m, 1h)")
    sc.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    sc.add_argument("--json", action="store_true", help="also print the answer (SandboxClaimStatus) as JSON")
    sc.set_defaults(fn=cmd_sandbox_claim)
    sl = ssub.add_parser("pools", help="print each pool's latest SandboxPoolStatus")
    common(sl)
    sl.set_defaults(fn=cmd_sandbox_pools)
    sp = sub.add_parser("publish", help="publish records (JSON lines, or Kubernetes manifests) to a topic")
    common(sp)
    sp.add_argument("file")
    sp.add_argument("--topic", required=True)
    sp.add_argument("--raw", action="store_true", help="send each line as it is, unvalidated")
    sp.set_defaults(fn=cmd_publish)
    sp = sub.add_parser("read", help="print a topic's records as JSON lines")
    common(sp)
    sp.add_argument("topic")
    sp.add_argument("--from-beginning", action="store_true")
    sp.add_argument("--limit", type=int, default=None, help="stop after this many records")
    sp.add_argument("--idle", type=float, default=5.0, help="stop after this many seconds without a record")
    sp.set_defaults(fn=cmd_read)
    sp = sub.add_parser("topics", help="show the topic catalogue; --create creates missing topics")
    common(sp)
    sp.add_argument("--create", action="store_true")
    sp.set_defaults(fn=cmd_topics)
    sp = sub.add_parser("config", help="print the settings in effect (defaults, --config, environment), "
                                       "secrets as ***")
    common(sp)
    sp.set_defaults(fn=cmd_config)
    sp = sub.add_parser("schema", help="JSON Schemas of the records")
    ssub = sp.add_subparsers(dest="schema_command", required=True)
    ex = ssub.add_parser("export", help="write one JSON Schema file per record kind")
    ex.add_argument("dir")
    ex.set_defaults(fn=cmd_schema)
    return p


def main(argv: list[str] | None = None) -> int:
    from rich.markup import escape

    from streams.connection import KafkaAccessRefused

    args = parser().parse_args(argv)
    try:
        code: int = args.fn(args)
    except SettingsError as exc:
        console.print(f"[red]settings: {exc}[/red]")
        code = 2
    except KafkaAccessRefused as exc:
        console.print(f"[red]kafka: {escape(str(exc))}[/red]", highlight=False)
        code = 2
    return code


if __name__ == "__main__":
    sys.exit(main())
