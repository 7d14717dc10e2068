"""aioproducer side by side with aiokafka and confluent-kafka, in one run, on the embedded broker.

    python benchmarks/run.py            # the full run (~35 minutes on 2 cores)
    python benchmarks/run.py --quick    # ~2 minutes
    python benchmarks/run.py --only per-record,latency

Each run: a fresh broker, a fresh 6-partition topic, the client in a fresh process, then the
records are counted back from the broker with librdkafka's consumer; a run whose count is
wrong is reported as failed, not as fast. Settings are the same for every client: 100-byte
values, 16-byte keys, acks=1, idempotence off (aiokafka's cannot start against Tansu),
linger 5 ms, batch 16 KiB. The table shows medians over the repetitions, with ranges, and
ratios of aioproducer to each peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import java  # noqa: E402  (benchmarks/java.py)
from aioproducer.testing import ApacheKafka, EmbeddedBroker, SimulatedCluster  # noqa: E402

# The shapes users write, aioproducer beside each peer's nearest equivalent (aiokafka's
# `send()` returns a future like our `enqueue()`; its `send_and_wait()` is our `send()`;
# confluent's AIOProducer.produce() returns a future too). "/asyncio": without uvloop.
# Every client holds the same 500k futures (what they cost the garbage collector grows with
# their number), but for aiokafka's and confluent's task per send_and_wait()/produce(), which
# take minutes past 50k records: those send 20k (ratios compare rates).
USER_SHAPES = [
    (shape, client, 500_000 if client == "aioproducer" else peer_records, [])
    for shape, peer_records in (("enqueue-gather", 500_000), ("enqueue-wait", 500_000),
                                ("enqueue-as-completed", 500_000), ("gather-send", 20_000),
                                ("taskgroup-send", 20_000))
    for client in ("aioproducer", "aiokafka", "confluent-aio")
]
# The same shapes of send() within buffer_memory (200k records of 116 B, 32 MiB): past it,
# sends wait in line for memory (as futures: still no Task from gather).
USER_SHAPES += [(f"{shape}/200k", client, 200_000 if client == "aioproducer" else records,
                 extra)
                for shape, client, records, extra in USER_SHAPES if shape.endswith("-send")]
USER_SHAPES += [(f"{shape}/asyncio", client, records, extra)
                for shape, client, records, extra in USER_SHAPES if "/" not in shape]
USER_SHAPES += [(f"{shape}/idempotent", client, records, ["--idempotence"])
                for shape, client, records, _ in USER_SHAPES
                if client == "aioproducer" and ("/" not in shape or shape.endswith("/200k"))]

# (scenario, client, records in the full run, extra args)
PLAN = USER_SHAPES + [
    ("per-record", "aioproducer", 500_000, []),
    ("per-record", "aiokafka", 200_000, []),
    ("per-record", "confluent-aio", 200_000, []),
    ("bulk", "aioproducer", 1_000_000, []),
    ("bulk", "aiokafka", 1_000_000, []),
    ("bulk", "confluent-sync", 1_000_000, []),
    ("bulk-keyless", "aioproducer", 1_000_000, ["--keyless"]),
    ("bulk-keyless", "aiokafka", 1_000_000, ["--keyless"]),
    ("bulk-keyless", "confluent-sync", 1_000_000, ["--keyless"]),
    ("concurrent", "aioproducer", 200_000, []),
    ("concurrent", "aiokafka", 100_000, []),
    # 20,000 samples: with 5,000 a round's p99 ratio ranged from 0.5x to 2.4x.
    ("latency", "aioproducer", 20_000, []),
    ("latency", "confluent-sync", 20_000, []),
    ("latency", "aiokafka", 20_000, []),
    # 100 tasks at 100 msg/s each, linger 5 ms (confluent: one thread at the same 10k msg/s).
    ("load-latency", "aioproducer", 50_000, ["--rate", "10000"]),
    ("load-latency", "confluent-sync", 50_000, ["--rate", "10000"]),
    ("load-latency", "aiokafka", 50_000, ["--rate", "10000"]),
    ("1KiB", "aioproducer", 200_000, ["--value-size", "1024"]),
    ("1KiB", "aiokafka", 100_000, ["--value-size", "1024"]),
    ("1KiB", "confluent-sync", 200_000, ["--value-size", "1024"]),
    # Sync code: produce() per record from one thread, then flush() (ours: BlockingProducer).
    ("sync", "aioproducer", 300_000, []),
    ("sync", "confluent-sync", 500_000, []),
    ("sync", "kafka-python", 50_000, []),
    # Sync code, bulk: 10,000 records a call (ours: produce_many(); confluent: produce_batch()).
    ("sync-bulk", "aioproducer", 1_000_000, []),
    ("sync-bulk", "confluent-sync", 1_000_000, []),
    # Through a 3-node SimulatedCluster whose partition leaders move every 300 ms (KIP-951:
    # the refusal names the new leader): per-record throughput, and latency at 10k msg/s.
    ("leader-moves", "aioproducer", 500_000, []),
    ("leader-moves", "aiokafka", 200_000, []),
    ("leader-moves", "confluent-aio", 200_000, []),
    ("leader-moves-latency", "aioproducer", 50_000, ["--rate", "10000"]),
    ("leader-moves-latency", "confluent-sync", 50_000, ["--rate", "10000"]),
    ("leader-moves-latency", "aiokafka", 50_000, ["--rate", "10000"]),
    ("idempotence-on", "aioproducer", 500_000, ["--idempotence"]),
    ("lz4", "aioproducer", 500_000, ["--codec", "lz4"]),
    # Observed (issue 28): OpenTelemetry's SDK with no exporter (metrics only; and a span per
    # send), and the Prometheus collector (no scrape), each compared with plain per-record.
    ("hooks-otel-metrics", "aioproducer", 500_000, ["--hooks", "otel-metrics"]),
    ("hooks-otel-traced", "aioproducer", 200_000, ["--hooks", "otel-traced"]),
    ("hooks-prometheus", "aioproducer", 500_000, ["--hooks", "prometheus"]),
]
VARIANTS = ("idempotence-on", "lz4", "hooks-otel-metrics", "hooks-otel-traced",
            "hooks-prometheus")  # of per-record, aioproducer only
# Latency rows pin the broker to one core and the client to the other, so that they do not
# take turns on one CPU (the cores, as `taskset` numbers them). The SimulatedCluster of the
# leader-moves rows runs in this process, which is not pinned.
PINNED = {"latency", "load-latency", "leader-moves-latency"}
BROKER_CORE, CLIENT_CORE = "0", "1"
SHAPE = {"bulk-keyless": "bulk", "1KiB": "bulk", "idempotence-on": "per-record",
         "lz4": "per-record", "leader-moves": "per-record", "hooks-otel-metrics": "per-record",
         "hooks-otel-traced": "per-record", "hooks-prometheus": "per-record",
         "leader-moves-latency": "load-latency"}
MOVING = {"leader-moves", "leader-moves-latency"}


# The yardsticks (issue 39, `--yardsticks`): the Java KafkaProducer in the same shapes, beside
# aioproducer and confluent-kafka, on each broker of `--brokers`. java-async sends with a
# callback per record (the bulk shapes, and the nearest Java equivalent of enqueue + gather),
# java-perf is Kafka's own ProducerPerformance (fire and forget, keyless), java-threads is
# 1,000 threads sharing one producer, each in send().get() (our 1,000 tasks awaiting send()),
# java-latency is send().get() one record at a time at the latency shape's slots.
YARDSTICKS = [
    ("bulk", "aioproducer", 500_000, []),
    ("bulk", "java-async", 500_000, []),
    ("bulk", "confluent-sync", 500_000, []),
    ("bulk-keyless", "aioproducer", 500_000, ["--keyless"]),
    ("bulk-keyless", "java-perf", 500_000, ["--keyless"]),
    ("bulk-keyless", "confluent-sync", 500_000, ["--keyless"]),
    ("enqueue-gather", "aioproducer", 500_000, []),
    ("enqueue-gather", "java-async", 500_000, []),
    ("concurrent", "aioproducer", 500_000, []),
    ("concurrent", "java-threads", 500_000, []),
    ("latency", "aioproducer", 5_000, []),
    ("latency", "java-latency", 5_000, []),
    ("latency", "confluent-sync", 5_000, []),
]
# Brokers: the embedded Tansu broker (fresh per run), and Apache Kafka (one cluster per run.py
# run, a fresh 6-partition topic per client run; on 3 nodes replicated 3 times, acks=all).
BROKERS = {"embedded": 0, "kafka1": 1, "kafka3": 3}


def count_back(bootstrap: str, topic: str, expected: int) -> int:
    """The records librdkafka reads back from `topic`, from offset 0 (as the tests'
    consume_all: OFFSET_BEGINNING asks ListOffsets EARLIEST, which Tansu 0.6 answers with
    the batch stored first in time, not the lowest offset), up to `expected` or 60 s."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                         "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        count, deadline = 0, time.monotonic() + 60
        while count < expected and time.monotonic() < deadline:
            count += sum(1 for m in consumer.consume(100_000, 0.5) if not m.error())
        return count
    finally:
        consumer.close()


def run_one(scenario: str, client: str, records: int, extra: list[str], uvloop: bool,
            kafka: ApacheKafka | None = None, round_: int = 0) -> dict:
    shape = SHAPE.get(scenario, scenario.split("/")[0])
    uvloop = uvloop and not scenario.endswith("/asyncio")
    if kafka is None and client in java.CLIENTS:
        # Tansu closes the connection on the Java client's ApiVersions v5 (instead of
        # answering UNSUPPORTED_VERSION, which the client would step down from).
        return {"error": "not on Tansu (it drops ApiVersions v5)"}
    acks = "all" if kafka is not None and kafka.nodes > 1 else "1"
    with contextlib.ExitStack() as moving:
        topic = f"bench-{scenario.replace('/', '-')}-{client}-{round_}"
        if kafka is None:
            broker = moving.enter_context(EmbeddedBroker())
            broker.create_topic(topic, 6)
        else:
            broker = kafka
            kafka.create_topic(topic, 6, replication_factor=kafka.nodes)
        bootstrap = broker.bootstrap
        cluster = None
        if scenario in MOVING:
            cluster = moving.enter_context(SimulatedCluster(nodes=3, upstream=broker,
                                                            lifetime=600))
            moving.enter_context(cluster.chaos(seed=951, duration=400, move_every=0.3,
                                               down_every=None, throttle_chance=0,
                                               cut_chance=0))
            bootstrap = cluster.bootstrap_servers
        pin: list[str] = []
        if scenario in PINNED and kafka is None:
            subprocess.run(["taskset", "-a", "-p", "-c", BROKER_CORE, str(broker.pid)],
                           check=True, capture_output=True)
            pin = ["taskset", "-c", CLIENT_CORE]
        # Java runs send a fifth more records first, as JIT warm-up, outside the timed phase.
        warmup = records // 5 if client in java.CLIENTS else 0
        if client in java.CLIENTS:
            cmd = [*pin, *java.command(client, bootstrap, topic, records, warmup,
                                       "--keyless" in extra, acks, rate=1000)]
        else:
            cmd = [*pin, sys.executable, str(ROOT / "benchmarks" / "clients.py"), client, shape,
                   "--bootstrap", bootstrap, "--topic", topic, "--records", str(records),
                   "--acks", acks, *extra, *(["--uvloop"] if uvloop else [])]
        # The client process's own CPU, start-up included (the broker is not reaped here).
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return {"error": "timed out"}
        process_seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
        try:
            if client == "java-perf":
                result = java.perf_result(done.stdout, records)
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError) as e:  # a cut-off line (clients.py says why it should not be)
            return {"error": f"unreadable result ({len(done.stdout)} characters on stdout: {e})"}
        result["cpu_process"] = (after.ru_utime + after.ru_stime
                                 - before.ru_utime - before.ru_stime)
        result["process_seconds"] = process_seconds
        result.setdefault("rss_mb", float("nan"))  # ProducerPerformance does not say
        records += warmup
        if cluster is not None:
            result["leader_moves"] = cluster.stats.leader_moves
        counted = count_back(broker.bootstrap, topic, records)
    if counted != records:
        return {"error": f"counted {counted} of {records} records back"}
    sent, records = records, records - warmup
    value_size = int(extra[extra.index("--value-size") + 1]) if "--value-size" in extra else 100
    key_size = 0 if "--keyless" in extra else 16
    result["msgs_per_s"] = records / result["seconds"]
    result["mb_per_s"] = records * (value_size + key_size) / result["seconds"] / 1e6
    # CPU per record: of the whole process (interpreter or JVM start-up, warm-up) per record
    # sent, and of the timed phase where the client reports it (cpu_run: clients.py's run,
    # Bench.java's steady state; ProducerPerformance cannot say).
    result["cpu_per_million"] = result["cpu_process"] / sent * 1e6
    if "cpu_run" in result:
        result["run_cpu_per_million"] = result["cpu_run"] / records * 1e6
    lat = sorted(result.pop("latencies"))
    if lat:
        result["p50_ms"] = lat[len(lat) // 2] * 1000
        result["p99_ms"] = lat[int(len(lat) * 0.99)] * 1000
    return result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def median_range(values: list[float], fmt: str, unit: str = "") -> str:
    if not values:
        return "-"
    med = format(statistics.median(values), fmt) + unit
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def paired(ours: list[dict], peer: list[dict], key: str) -> str:
    """Ratio of ours to the peer's run in the same round: median (min–max) over the rounds."""
    ratios = [o[key] / p[key] for o, p in zip(ours, peer) if "error" not in o and "error" not in p]
    return median_range(ratios, ".2f", "x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records, one repetition")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--only", default="", help="comma-separated scenarios or clients")
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--yardsticks", action="store_true",
                        help="the Java KafkaProducer's rows beside ours (issue 39), not PLAN")
    parser.add_argument("--brokers", default="embedded",
                        help=f"comma-separated, of {', '.join(BROKERS)}: every row on each")
    parser.add_argument("--records", type=int, default=0,
                        help="every row's record count but the latency rows'")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 3)
    only = {x for x in args.only.split(",") if x}
    uvloop = not args.no_uvloop
    if uvloop:
        try:
            import uvloop as _  # noqa: F401
        except ImportError:
            uvloop = False
    brokers = [b for b in args.brokers.split(",") if b]
    if unknown := set(brokers) - set(BROKERS):
        parser.error(f"unknown brokers {', '.join(sorted(unknown))}: {', '.join(BROKERS)}")
    # A row's label names its broker when there is more than the embedded one.
    plan = []
    where: dict[str, tuple[str, str]] = {}  # label -> (scenario, broker)
    for broker in brokers:
        for scenario, client, records, extra in YARDSTICKS if args.yardsticks else PLAN:
            if only and scenario not in only and client not in only:
                continue
            n = max(records // 5, 1000) if args.quick and scenario not in PINNED else records
            if args.quick and scenario in PINNED:
                n = 2000 if scenario == "latency" else 10_000
            n = args.records or n if scenario not in PINNED else n
            label = scenario if brokers == ["embedded"] else f"{scenario} [{broker}]"
            where[label] = (scenario, broker)
            plan.append((label, client, n, extra))
    load = [os.getloadavg()]
    with contextlib.ExitStack() as stack:
        kafkas = {broker: stack.enter_context(ApacheKafka(nodes=BROKERS[broker]))
                  for broker in brokers if BROKERS[broker]}
        # Round after round, every client once per round: a shared host's speed drifts over a
        # run, and this way the drift touches every client alike (the ratios below pair each
        # round).
        runs: list[list[dict]] = [[] for _ in plan]
        for round_ in range(repeat):
            for (label, client, n, extra), client_runs in zip(plan, runs):
                scenario, broker = where[label]
                result = run_one(scenario, client, n, extra, uvloop, kafkas.get(broker), round_)
                client_runs.append(result)
                outcome = result.get("error") or f"{result['msgs_per_s']:,.0f} msgs/s" + (
                    f", {result['leader_moves']} leader moves" if "leader_moves" in result
                    else "")
                print(f"round {round_ + 1}/{repeat}  {label:15} {client:15} {outcome}  "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
            load.append(os.getloadavg())
        report(args, repeat, uvloop, brokers, kafkas, plan, runs, load)


def report(args: argparse.Namespace, repeat: int, uvloop: bool, brokers: list[str],
           kafkas: dict[str, ApacheKafka], plan: list[tuple[str, str, int, list[str]]],
           runs: list[list[dict]], load: list[tuple[float, float, float]]) -> None:
    """The table, printed (and for a full run written) before the clusters stop: a teardown
    that fails on a busy machine must not take the run's figures with it."""
    rows = []
    for (scenario, client, n, _), client_runs in zip(plan, runs):
        good = [r for r in client_runs if "error" not in r]
        errors = [r["error"] for r in client_runs if "error" in r]
        rows.append((scenario, client, n, good, errors))

    versions = ", ".join(f"{p} {version(p)}" for p in ("aiokafka", "confluent-kafka")) + \
        f", aioproducer {version('aioproducer')}"
    lines = [
        "# Producer benchmark", "",
        f"`python benchmarks/run.py {' '.join(sys.argv[1:])}` on {os.cpu_count()} cores "
        f"({cpu_model()}), "
        f"Python {platform.python_version()}, {versions}, uvloop {'on' if uvloop else 'off'} "
        f"for the asyncio clients; embedded Tansu broker on the same machine (latency rows: "
        f"broker pinned to core {BROKER_CORE}, client to core {CLIENT_CORE}"
        + ("; leader-moves rows: the SimulatedCluster in run.py's process, not pinned"
           if any(scenario in MOVING for scenario, *_ in plan) else "") + "); "
        f"median (min–max) of {repeat} run(s)."
        + (f" Brokers: {', '.join(brokers)} (Apache Kafka {next(iter(kafkas.values())).version}: kafka1 one "
           "node, acks=1; kafka3 three nodes, replication factor 3, acks=all; one cluster for "
           "the whole run, a fresh topic per client run; pinning only on Tansu)."
           if brokers != ["embedded"] else "")
        + " Load average (1, 5, 15 min) at the start and after each round: "
        + "; ".join(" ".join(f"{x:.1f}" for x in avg) for avg in load)
        + " (2 is both cores busy; the run's own brokers and clients count).", "",
        "| scenario | client | records | msgs/s | MB/s | CPU s / 1M msgs | p50 / p99 ms | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for scenario, client, n, good, errors in rows:
        if not good:
            lines.append(f"| {scenario} | {client} | {n:,} | failed: {'; '.join(errors)} | | | | |")
            continue
        med = {k: statistics.median(r[k] for r in good)
               for k in ("msgs_per_s", "cpu_per_million", "rss_mb", "mb_per_s")}
        if "p50_ms" in good[0]:
            med["p50_ms"] = statistics.median(r["p50_ms"] for r in good)
            med["p99_ms"] = statistics.median(r["p99_ms"] for r in good)
        medians[(scenario, client)] = med
        latency = f"{med['p50_ms']:.2f} / {med['p99_ms']:.2f}" if "p50_ms" in med else "-"
        lines.append(
            f"| {scenario} | {client} | {n:,} | "
            f"{median_range([r['msgs_per_s'] for r in good], ',.0f')} | {med['mb_per_s']:.1f} | "
            f"{med['cpu_per_million']:.1f} | {latency} | {med['rss_mb']:.0f} |")
    lines += ["", "Ratios aioproducer / peer in the same round (median, and range over the rounds): "
              "throughput, CPU per record, latency percentiles.", ""]
    by_client = {(scenario, client): client_runs
                 for (scenario, client, _, _), client_runs in zip(plan, runs)}
    for (scenario, client), peer_runs in by_client.items():
        ours = by_client.get((scenario, "aioproducer"))
        if client == "aioproducer" or ours is None:
            continue
        parts = [f"throughput {paired(ours, peer_runs, 'msgs_per_s')}",
                 f"CPU/record {paired(ours, peer_runs, 'cpu_per_million')}"]
        if all("run_cpu_per_million" in r for r in [*ours, *peer_runs] if "error" not in r):
            parts.append(f"timed-phase CPU/record "
                         f"{paired(ours, peer_runs, 'run_cpu_per_million')}")
        if "p99_ms" in medians.get((scenario, client), {}):
            parts.append(f"p50 {paired(ours, peer_runs, 'p50_ms')}")
            parts.append(f"p99 {paired(ours, peer_runs, 'p99_ms')}")
        lines.append(f"- {scenario}, vs {client}: " + ", ".join(parts))
    java_rows = [(label, client, r) for (label, client), client_runs in by_client.items()
                 for r in client_runs if client in java.CLIENTS and "error" not in r]
    if java_rows:
        lines += ["", "Java rows: msgs/s above is the steady state, after a fifth more records "
                  "sent first as warm-up; here the JVM's start-up (JVM start to the records "
                  "made, Bench.java), the warm-up's time, the whole process's wall time, and "
                  "CPU per record of the timed phase (ProducerPerformance cannot say) and of "
                  "the whole process (also in the table above), medians:", ""]
        for (label, client) in dict.fromkeys((label, client) for label, client, _ in java_rows):
            good = [r for lab, c, r in java_rows if (lab, c) == (label, client)]

            def med(key: str, fmt: str, rows: list[dict] = good) -> str:
                values = [r[key] for r in rows if key in r]
                return format(statistics.median(values), fmt) if values else "-"
            lines.append(f"- {label}, {client}: start-up {med('startup_seconds', '.2f')} s, "
                         f"warm-up {med('warmup_seconds', '.2f')} s, process "
                         f"{med('process_seconds', '.1f')} s; CPU s / 1M msgs timed phase "
                         f"{med('run_cpu_per_million', '.2f')}, whole process "
                         f"{med('cpu_per_million', '.2f')}")
    plain = by_client.get(("per-record", "aioproducer"))
    for variant in VARIANTS:
        if plain and (variant, "aioproducer") in by_client:
            lines.append(f"- aioproducer {variant} / plain per-record: throughput "
                         f"{paired(by_client[(variant, 'aioproducer')], plain, 'msgs_per_s')}")
    for (scenario, client), variant_runs in by_client.items():
        base = by_client.get((scenario.removesuffix("/idempotent"), client))
        if scenario.endswith("/idempotent") and base:
            lines.append(f"- aioproducer {scenario} / plain: throughput "
                         f"{paired(variant_runs, base, 'msgs_per_s')}")
    text = "\n".join(lines) + "\n"
    if not (args.quick or args.only or args.yardsticks or args.records
            or brokers != ["embedded"]):  # the docs quote the last full run: no partial ones
        out = ROOT / "benchmarks" / "results" / "latest.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
