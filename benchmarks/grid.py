"""The cost as the work grows (issue 42): throughput and client CPU per record against the
number of partitions and against the record size, one line per client, in one run.

    python benchmarks/grid.py [--repeat N] [--scale F] [--points P,...] [--clients C,...]
                              [--broker embedded|kafka]
    ./dev grid ...

Points: 100-byte values on 6, 100, 1,000, 3,000 and 10,000 partitions (`p6` ... `p10000`);
values of 100 B, 1 KB, 10 KB, 100 KB and 1 MB on 6 partitions (`s100` ... `s1000000`; `s100`
is `p6`). Keys of 16 bytes (`key-` and a number below 100,000: keyed records spread over
every partition). Clients, each with its own defaults but linger 5 ms, acks=1, idempotence
off: `aioproducer` (`futs = [await enqueue() ...]; await asyncio.gather(*futs)`),
`aioproducer-bulk` (enqueue_many, 10,000 records a call), `confluent` (the sync Producer:
produce() and poll(0) per record, then flush()), `aiokafka` (`await send()` per record, the
futures gathered; a tenth of the records: it is 20-80x slower per record here).

Each run: a fresh embedded broker and topic (`--broker kafka`: one 1-node Apache Kafka for the
whole run, aioproducer.testing.ApacheKafka, warmed up by an untimed write of 150k records,
and a fresh topic, deleted after; each run starts once the node is idle), the client in a
fresh process (clients.py),
timing its produce phase and its CPU (no interpreter start), then the records are counted
back; a wrong count is an error, not a point. Per round every client runs once at every
point, the order of the clients turning from round to round; ratios are taken within a
round, then the median over the rounds. Writes results/grid.md and results/grid.png (with
--out, elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from aioproducer.testing import ApacheKafka, EmbeddedBroker  # noqa: E402
from request_shape import jvm_seconds  # noqa: E402
from run import cpu_model  # noqa: E402

PARTITIONS = (6, 100, 1000, 3000, 10_000)
# "1 MB" is 999,900 bytes: with its key and framing a value of 1,000,000 is past
# librdkafka's default message.max.bytes (1,000,000), which refuses it (MSG_SIZE_TOO_LARGE).
SIZES = (100, 1000, 10_000, 100_000, 999_900)
# Records per point in a full run (--scale multiplies): about the same seconds per point.
RECORDS_BY_SIZE = {100: 200_000, 1000: 150_000, 10_000: 20_000, 100_000: 3000, 999_900: 300}
KEY_SIZE = 16
# client -> (clients.py client, scenario, share of the records)
CLIENTS = {
    "aioproducer": ("aioproducer", "enqueue-gather", 1.0),
    "aioproducer-bulk": ("aioproducer", "bulk", 1.0),
    "confluent": ("confluent-sync", "bulk", 1.0),  # (its loop: produce() + poll(0))
    "aiokafka": ("aiokafka", "enqueue-gather", 0.1),
}
STYLE = {"aioproducer": ("tab:blue", "o-"), "aioproducer-bulk": ("tab:cyan", "s--"),
         "confluent": ("tab:red", "^-"), "aiokafka": ("tab:gray", "x:")}


def points() -> dict[str, tuple[int, int]]:
    """name -> (partitions, value size)."""
    grid = {f"p{n}": (n, 100) for n in PARTITIONS}
    grid.update({f"s{size}": (6, size) for size in SIZES if size != 100})
    return grid


def run_one(client: str, partitions: int, size: int, records: int, uvloop: bool,
            kafka: ApacheKafka | None) -> dict:
    topic = f"grid-{partitions}-{size}-{client}-{time.monotonic_ns()}"
    if kafka is None:
        with EmbeddedBroker() as broker:
            broker.create_topic(topic, partitions)
            return measure(client, broker.bootstrap, topic, size, records, uvloop)
    # KRaft's controller refuses an operation of more than 10,000 records ("excessively
    # large batch operation"): a topic of 10,000 partitions is made in two steps.
    kafka.create_topic(topic, min(partitions, 5000))
    try:
        if partitions > 5000:
            kafka.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                           kafka.bootstrap, "--alter", "--topic", topic,
                           "--partitions", str(partitions))
        settled = settle(kafka)
        return {**measure(client, kafka.bootstrap, topic, size, records, uvloop),
                "settle_s": settled}
    finally:  # 10,000 partitions a run: one node keeps only the topic in use
        kafka.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                       kafka.bootstrap, "--delete", "--topic", topic)


def settle(kafka: ApacheKafka, idle: float = 0.1, limit: float = 30.0) -> float:
    """Wait (at most `limit` seconds) until the node's JVM uses under `idle` of a core: a
    topic of thousands of partitions goes on costing it CPU after its creation and deletion
    (logs and indexes made and removed), and whichever client ran next paid for it (the
    1 KB point after 3,000 partitions: 0.24x-0.28x confluent in two grids, 0.56x-0.60x
    alone). Returns the seconds waited."""
    pid = kafka.pid(0)
    assert pid is not None
    start = time.monotonic()
    while time.monotonic() < start + limit:
        before = jvm_seconds(pid)
        time.sleep(0.5)
        if jvm_seconds(pid) - before < idle * 0.5:
            break
    return time.monotonic() - start


def measure(client: str, bootstrap: str, topic: str, size: int, records: int,
            uvloop: bool) -> dict:
    name, scenario, _ = CLIENTS[client]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "clients.py"), name, scenario,
           "--bootstrap", bootstrap, "--topic", topic, "--records", str(records),
           "--value-size", str(size), "--defaults",
           *(["--uvloop"] if uvloop and name != "confluent-sync" else [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    counted = asyncio.run(count_back(bootstrap, topic, records))
    if counted != records:
        return {"error": f"counted {counted} of {records} records back"}
    result.pop("latencies", None)
    result["records"] = records
    result["rec_s"] = records / result["seconds"]
    result["mb_s"] = records * (size + KEY_SIZE) / result["seconds"] / 1e6
    result["us_cpu"] = result["cpu_run"] / records * 1e6
    return result


async def count_back(bootstrap: str, topic: str, expected: int) -> int:
    """The records in the topic, read with one Fetch for every partition at a time (our
    TopicReader: librdkafka's consumer counted 3,465 of 20,000 records on 10,000 partitions
    in a minute)."""
    from aioproducer.config import ProducerConfig
    from aioproducer.tools.reader import TopicReader

    count, deadline = 0, time.monotonic() + 120
    config = ProducerConfig.from_properties({"bootstrap.servers": bootstrap})
    async with TopicReader(config, topic,
                           from_beginning=True) as reader:
        while count < expected and time.monotonic() < deadline:
            count += len(await reader.fetch(max_wait=0.5))
    return count


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: dict[tuple[str, str], list[dict]], names: list[str],
              clients: list[str]) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per point and client: median throughput, MB/s and CPU per record; and ratios to
    confluent taken within each round (then the median)."""
    summary = {}
    for point in names:
        peer = runs.get((point, "confluent"), [])
        for client in clients:
            ok = [r for r in runs.get((point, client), []) if "error" not in r]
            ratios = [r["rec_s"] / p["rec_s"] for r, p in zip(runs.get((point, client), []), peer)
                      if "error" not in r and "error" not in p]
            summary[(point, client)] = {
                "rec_s": median([r["rec_s"] for r in ok]),
                "mb_s": median([r["mb_s"] for r in ok]),
                "us_cpu": median([r["us_cpu"] for r in ok]),
                "vs_confluent": median(ratios),
                "errors": len(runs.get((point, client), [])) - len(ok),
            }
    return summary


def table(summary, grid, names, clients, args, started: str, load: str,
          broker: str) -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    ours = summary.get(("p6", "aioproducer"), {}).get("us_cpu")
    lines = [
        "# The grid: cost as partitions and record sizes grow (issue 42)",
        "",
        f"`python benchmarks/grid.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"started {started}; {cpu_model()}, {os.cpu_count()} cores; {broker}; "
        f"{args.repeat} round(s), each client in a fresh process, clients alternated; "
        f"load average at the start {load} (1, 5 and 15 minutes; 2 is both cores busy).",
        "",
        "Each client's defaults but linger 5 ms, acks=1, idempotence off (our batch_size: "
        "see the README's Settings). Throughput in records/s (MB/s), client CPU per record "
        "in us (its produce phase), x = throughput against confluent-kafka in the same round "
        "(median over rounds). `cpu/p6` = CPU per record against aioproducer enqueue+gather "
        "at 100 B on 6 partitions (the issue's bound is 1.5x where the size is the same).",
        "",
        "| point | client | records/s | MB/s | us CPU/record | x confluent | cpu/p6 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for point in names:
        partitions, size = grid[point]
        for client in clients:
            s = summary[(point, client)]
            ratio_p6 = None
            if ours and s["us_cpu"] is not None and size == 100 and \
                    client.startswith("aioproducer"):
                ratio_p6 = s["us_cpu"] / ours
            err = f" ({s['errors']} failed)" if s["errors"] else ""
            lines.append(
                f"| {partitions} partitions, {size:,} B | {client}{err} | "
                f"{fmt(s['rec_s'], ',.0f')} | {fmt(s['mb_s'], ',.1f')} | "
                f"{fmt(s['us_cpu'], '.2f')} | "
                f"{'-' if s['vs_confluent'] is None else format(s['vs_confluent'], '.2f') + 'x'}"
                f" | {'-' if ratio_p6 is None else format(ratio_p6, '.2f') + 'x'} |")
    return "\n".join(lines) + "\n"


def plot(summary, grid, names, clients, path: Path, broker: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    by_partitions = [p for p in names if grid[p][1] == 100]
    by_size = [p for p in names if grid[p][0] == 6]
    for column, (chosen, x_of, label) in enumerate((
            (by_partitions, lambda p: grid[p][0], "partitions (100-byte values)"),
            (by_size, lambda p: grid[p][1], "value size, bytes (6 partitions)"))):
        chosen = sorted(chosen, key=x_of)
        for client in clients:
            xs = [x_of(p) for p in chosen]
            color, style = STYLE[client]
            for row, key in enumerate(("mb_s" if column else "rec_s", "us_cpu")):
                ys = [summary[(p, client)][key] for p in chosen]
                pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
                if pairs:
                    axes[row][column].plot(*zip(*pairs), style, color=color, label=client)
        for row, ylabel in enumerate(("MB/s" if column else "records/s",
                                      "client CPU per record, us")):
            ax = axes[row][column]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    axes[0][0].set_title("throughput against partitions")
    axes[0][1].set_title("throughput against record size")
    axes[1][0].set_title("CPU per record against partitions")
    axes[1][1].set_title("CPU per record against record size")
    fig.suptitle("aioproducer, confluent-kafka and aiokafka as the work grows "
                 f"({broker}, each client's defaults, linger 5 ms, acks=1)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="rounds")
    parser.add_argument("--scale", type=float, default=1.0, help="records per point, times")
    parser.add_argument("--points", default="", help="comma-separated: p6,p100,...,s1000,...")
    parser.add_argument("--clients", default="", help="comma-separated: " + ",".join(CLIENTS))
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--broker", choices=("embedded", "kafka"), default="embedded",
                        help="the embedded Tansu broker, or a 1-node Apache Kafka")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grid"),
                        help="path of the results without .md/.png/.json")
    args = parser.parse_args()
    grid = points()
    names = [p for p in grid if not args.points or p in args.points.split(",")]
    clients = [c for c in CLIENTS if not args.clients or c in args.clients.split(",")]
    if "confluent" not in clients:
        clients.append("confluent")  # the ratios' reference
    uvloop = not args.no_uvloop
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    runs: dict[tuple[str, str], list[dict]] = {}
    with contextlib.ExitStack() as stack:
        kafka = (stack.enter_context(ApacheKafka(heap_mb=1024)) if args.broker == "kafka"
                 else None)
        broker = (f"Apache Kafka {kafka.version}, 1 node" if kafka
                  else "embedded Tansu broker")
        if kafka is not None:  # the JVM's warm-up, untimed: or the first client pays for it
            run_one("aioproducer-bulk", 6, 1000, 150_000, uvloop, kafka)
        for round_ in range(args.repeat):
            for index, point in enumerate(names):
                partitions, size = grid[point]
                turn = (round_ + index) % len(clients)
                for client in clients[turn:] + clients[:turn]:
                    records = max(int(RECORDS_BY_SIZE[size] * args.scale * CLIENTS[client][2]), 20)
                    try:
                        result = run_one(client, partitions, size, records, uvloop, kafka)
                    except Exception as failed:  # one point's failure keeps the others
                        result = {"error": f"{type(failed).__name__}: {failed}"}
                    runs.setdefault((point, client), []).append(result)
                    shown = result.get("error") or (f"{result['rec_s']:,.0f} rec/s, "
                                                    f"{result['us_cpu']:.2f} us CPU/rec")
                    if result.get("settle_s", 0) > 1:
                        shown += f" (the node busy {result['settle_s']:.1f} s before)"
                    print(f"round {round_ + 1} {point:>9} {client:<17} {records:>7} {shown}",
                          flush=True)
    summary = summarize(runs, names, clients)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = table(summary, grid, names, clients, args, started, load, broker)
    out.with_suffix(".json").write_text(json.dumps(
        {f"{p} {c}": r for (p, c), r in runs.items()}, indent=1))
    plot(summary, grid, names, clients, out.with_suffix(".png"), broker)
    text += f"\n![the grid]({out.with_suffix('.png').name})\n"
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
