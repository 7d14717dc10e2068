"""Where the Java producer and aioproducer spend their CPU per record, in the shapes where Java
led in the yardstick runs (issue 39): `python benchmarks/yardstick_profile.py [--records N]
[--shapes async,threads,latency] [--out DIR]`.

On one 1-node Apache Kafka (the Java client cannot use the embedded broker), each shape runs
five client processes, one after another:

- Java, plain: Bench.java's steady-state CPU per record (after its warm-up records), and each
  thread's share of it from /proc (the caller's threads, the sender thread, GC, JIT).
- Java, profiled: the same under `perf record` (per thread: time in Java code, in the JVM's
  own code, in native libraries and in the kernel, over the steady state's window) and Java
  Flight Recorder (the steady state alone: which Java methods, inlined frames included).
- aioproducer, plain: clients.py's CPU per record over its run (`cpu_run`).
- aioproducer under py-spy with native frames (which Python functions; the samples inside the
  event loop's run only), and under perf (the kernel and the C encoder, which py-spy
  overstates on a busy machine: see SYSCALLS).

CPU per record by component is a plain run's CPU per record times the profiled runs' share of
the component: shares move less with the machine's load than times do. Prints the tables
(each client's components, then both side by side by role) and writes every figure and the
recordings into --out; `--reanalyze` prints them again from there without running anything.
Needs perf, and py-spy (PyPI) on PATH or as --py-spy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import java

from aioproducer.testing import ApacheKafka

# name: (Java shape, our clients.py scenario, records)
SHAPES = {"async": ("java-async", "enqueue-gather", 200_000),
          "threads": ("java-threads", "concurrent", 200_000),
          "latency": ("java-latency", "latency", 5_000)}
TITLES = {"async": "send(record, callback) per record / enqueue + gather",
          "threads": "1,000 threads in send().get() / 1,000 tasks awaiting send()",
          "latency": "send().get() one at a time at 1,000/s / await send() at 1,000/s"}


# -- Java --------------------------------------------------------------------------------------

def thread_group(name: str) -> str:
    """A Java thread (its name as /proc or perf show it, 15 characters) by what it does."""
    if name in ("java", "main") or name.startswith("sender-") or name == "(exited)":
        return "caller"
    if name.startswith("kafka-producer"):
        return "sender thread"
    if name.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "GC"
    if name.startswith(("C1 Compiler", "C2 Compiler")):
        return "JIT"
    if name.startswith("JFR") or name == "perf":
        return "profiler"
    return "other threads"


# Java frames by class (and method): walking a sample's frames from the leaf towards the root,
# the first frame that matches names the component (a lock's frames, AbstractQueuedSynchronizer
# or LockSupport, go to whoever took the lock).
JAVA_CALLER = [
    (r"Crc32C|CRC32C", "CRC"),
    (r"\.record\.|ByteUtils",
     "record format code (MemoryRecordsBuilder, DefaultRecord, size estimates)"),
    (r"BufferPool", "buffer pool"),
    (r"RecordAccumulator", "RecordAccumulator.append (deque, lock, batch)"),
    (r"Partitioner|murmur2", "partitioner"),
    (r"[Ss]erializer", "serialization"),
    (r"ProducerMetadata|\.Metadata\.|\.Cluster\.|MetadataCache", "metadata lookup"),
    (r"FutureRecordMetadata|ProduceRequestResult|CountDownLatch",
     "the record's future: get() and parking"),
    (r"\.metrics\.|Sensor", "metrics"),
    (r"KafkaProducer", "KafkaProducer.send()'s own code"),
    (r"^Bench", "harness (the loop, ProducerRecord)"),
]
JAVA_SENDER = [
    (r"Crc32C|CRC32C", "CRC"),
    ((r"ProducerBatch\.(done|complete)|ProduceRequestResult|FutureRecordMetadata|^Bench"
      r"|CountDownLatch|Thunk"),
     "completing records: futures, callbacks, waking callers"),
    (r"RecordAccumulator|\.record\.|ProducerBatch|BufferPool", "drain and batch close"),
    (r"\.metrics\.|Sensor|SenderMetrics", "metrics"),
    (r"\.message\.|\.protocol\.|\.requests\.|RequestHeader|ResponseHeader",
     "request building, response parsing"),
    (r"\.network\.|sun\.nio|java\.nio|Selector", "selector and socket I/O"),
    (r"NetworkClient|Sender|InFlightRequests|ClusterConnectionStates", "Sender and NetworkClient"),
]


def jfr_samples(path: Path) -> list[tuple[str, list[str]]]:
    """(thread name, frames leaf first as Class.method) of every jdk.ExecutionSample."""
    done = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events",
                           "jdk.ExecutionSample", str(path)], capture_output=True, text=True,
                          check=True, timeout=300)
    samples = []
    for event in json.loads(done.stdout)["recording"]["events"]:
        values = event["values"]
        thread = (values.get("sampledThread") or {}).get("javaName") or "?"
        frames = [f"{f['method']['type']['name']}.{f['method']['name']}".replace("/", ".")
                  for f in (values.get("stackTrace") or {}).get("frames", [])]
        samples.append((thread, frames))
    return samples


def classify(frames: list[str], rules: list[tuple[str, str]]) -> str:
    compiled = [(re.compile(pattern), name) for pattern, name in rules]
    for frame in frames:
        for pattern, name in compiled:
            if pattern.search(frame):
                return name
    return "other Java code"


def java_code_shares(samples: list[tuple[str, list[str]]]) -> dict[str, dict[str, float]]:
    """Per thread group (caller, sender thread): each component's share of its Java samples."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for thread, frames in samples:
        if any(f.startswith(("jdk.jfr.", "jdk.internal.platform.")) for f in frames):
            continue  # the recorder's own work (writing events) on the thread it sampled
        group = "sender thread" if thread.startswith("kafka-producer") else (
            "caller" if thread == "main" or thread.startswith("sender-") else None)
        if group is None:
            continue
        counts[group][classify(frames, JAVA_CALLER if group == "caller" else JAVA_SENDER)] += 1
    return {group: {name: n / sum(c.values()) for name, n in c.items()}
            for group, c in counts.items()}


def dso_kind(dso: str) -> str:
    if dso.startswith("[kernel"):
        return "kernel"
    if dso == "libjvm.so":
        return "JVM runtime (libjvm)"
    if dso in ("[unknown]", "[JIT]") or dso.startswith(("perf-", "//anon", "[JIT]")):
        return "Java code"
    if "_c.cpython" in dso:
        return "our C extension"
    if "uvloop" in dso or dso.startswith("loop.cpython"):
        return "uvloop and libuv"
    if "libpython" in dso or dso.startswith("python"):
        return "the interpreter (libpython)"
    return "native libraries (libc, libnio)"


KERNEL = [  # kernel functions by what the process asked of the kernel
    (r"futex", "futex (parking and waking threads)"),
    (r"^ep_|epoll", "epoll"),
    ((r"schedule|switch|pick_next|enqueue_task|dequeue_task|update_curr|sched|idle"
      r"|_raw_spin_unlock_irq|try_to_wake_up|ttwu"),
     "scheduler (context switches, wake-ups)"),
    ((r"tcp|skb|dev_|^ip_|sock|inet|loopback|net|napi|copy_user|copy_from|copy_to|_iter"
      r"|memcpy|memmove|csum|nf_hook|rep_movs|release_sock|softirq"),
     "socket writes and reads (TCP)"),
    (r"page|fault|mm|folio|pte|lru|vma|alloc|charge|memcg|mem_cgroup", "page faults, memory"),
]


def kernel_class(symbol: str) -> str:
    for pattern, name in KERNEL:
        if re.search(pattern, symbol):
            return name
    return "syscall entry and exit, other"


def perf_rows(data: Path, window: tuple[float, float] | None) -> list[tuple[float, str, str, str]]:
    """(share, thread name, dso, symbol) of perf's samples, within `window` (seconds of the
    recording's clock) if given."""
    cmd = ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort",
           "comm,dso,sym", "-t", ";"]
    if window is not None:
        cmd += ["--time", f"{window[0]:.6f},{window[1]:.6f}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    rows = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(";")]
        if len(parts) < 4 or not parts[0].endswith("%"):
            continue
        rows.append((float(parts[0].rstrip("%")) / 100, parts[1], parts[2], parts[3][4:]))
    return rows


def kind_of(dso: str, symbol: str) -> str:
    kind = dso_kind(dso)
    return f"kernel: {kernel_class(symbol)}" if kind == "kernel" else kind


def perf_split(data: Path, steady_ns: list[int]) -> dict[str, dict[str, float]]:
    """From `perf record -k CLOCK_MONOTONIC` (System.nanoTime's clock), the steady state's
    samples per thread group, as shares of that group's samples by kind of code: Java code
    (JIT-compiled or interpreted), the JVM's own, native libraries, the kernel by what for."""
    split: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for share, comm, dso, symbol in perf_rows(data, (steady_ns[0] / 1e9, steady_ns[1] / 1e9)):
        split[thread_group(comm)][kind_of(dso, symbol)] += share
    return {g: {k: v / sum(c.values()) for k, v in c.items()} for g, c in split.items()}


def java_runs(shape: str, kafka: ApacheKafka, records: int, out: Path) -> dict:
    client, _, _ = SHAPES[shape]
    runs = {}
    for mode in ("plain", "profiled"):
        topic = f"profile-{shape}-java-{mode}"
        kafka.create_topic(topic, 6)
        cmd = java.command(client, kafka.bootstrap, topic, records, records // 5, False, "1",
                           1000)
        if mode == "profiled":
            cmd = ["perf", "record", "-q", "-F", "3999", "-k", "CLOCK_MONOTONIC", "-o",
                   str(out / f"java-{shape}.perf.data"), "--", *cmd,
                   "--jfr", str(out / f"java-{shape}.jfr")]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"java {shape} {mode}: {done.stderr[-2000:]}")
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        runs[mode].pop("latencies")
        runs[mode]["load"] = os.getloadavg()[0]
    return runs


def java_analysis(shape: str, records: int, out: Path, runs: dict) -> dict:
    """CPU per record by thread from the plain run (/proc), each of the caller's and the
    sender thread's split by kind of code (perf), their Java code by component (JFR)."""
    plain, profiled = runs["plain"], runs["profiled"]
    samples = jfr_samples(out / f"java-{shape}.jfr")
    shares = java_code_shares(samples)
    split = perf_split(out / f"java-{shape}.perf.data", profiled["steady_ns"])
    per_group: collections.Counter[str] = collections.Counter()
    for name, (user, system) in plain["threads"].items():
        per_group[thread_group(name)] += (user + system) / records * 1e6
    components: dict[str, float] = {}
    for group, us in per_group.items():
        if group not in ("caller", "sender thread"):
            components[group] = us
            continue
        for kind, share in split.get(group, {"Java code": 1.0}).items():
            if kind != "Java code":
                components[f"{group}: {kind}"] = us * share
                continue
            for name, java_share in shares.get(group, {"other Java code": 1.0}).items():
                components[f"{group}: {name}"] = us * share * java_share
    return {"records": records, "cpu_run_us": plain["cpu_run"] / records * 1e6,
            "seconds": plain["seconds"], "threads_us": dict(per_group),
            "components_us": components, "jfr_shares": shares, "jfr_samples": len(samples),
            "perf_split": split, "runs": runs}


# -- aioproducer --------------------------------------------------------------------------------

def ours_component(frames: list[tuple[str, str]]) -> str | None:
    """The component of one py-spy sample (frames leaf first, as (function, file)); None for a
    sample outside the event loop's run (interpreter start, imports, making the records)."""
    files = [f for _, f in frames]
    if not any("uvloop/__init__" in f or "asyncio/runners" in f for f in files):
        return None
    for function, file in frames:
        if function.startswith(("gc_collect", "collect_generations")):
            return "cyclic GC"
    for function, file in frames:
        if not file.endswith(".py"):  # a native frame
            if "_speedups" in file:
                if function.endswith(("encode_produce", "decode_produce")):
                    return "sender task: request/response codec (C)"
                if function.startswith(("fields_", "py_new_tuple", "py_same_context")):
                    # RecordFields (the handle's C part), RecordMetadata's tuple, contexts
                    return "Future protocol (our handle, completing it)"
                return "the C encoder"
            if "libc" in file or "uvloop" in file or "libuv" in file:
                # The system calls and libuv/uvloop's own I/O code (not the interpreter's
                # gen_send and the like, which are coroutine machinery).
                if "epoll" in function:
                    return "event loop: polling"
                if re.search(r"write|send", function):
                    return "socket writes"
                if re.search(r"read|recv", function):
                    return "socket reads"
            continue
        if "uvloop/__init__" in file or "asyncio/runners" in file:
            break  # the loop's own frames up to here: scheduling, a task's step
        if file.endswith("benchmarks/clients.py"):
            return "user code (the harness loop)"
        if "asyncio/tasks" in file or "asyncio/futures" in file:
            return "Future protocol / gather (asyncio side)"
        if file.endswith("_internal/batch.py"):
            return "Future protocol (our handle, completing it)"
        if re.search(r"aioproducer/(producer|_internal/(intake|accumulator|partitioner|arguments)"
                     r"|serializers)\.py$", file):
            return "enqueue's Python frames"
        if re.search(r"aioproducer/(_internal/sender|client/|protocol/)", file):
            return "sender task (Python)"
        if "aioproducer" in file:
            return "other aioproducer"
    return "event loop and scheduling (uvloop, task steps)"


_RAW = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def pyspy_shares(path: Path) -> tuple[dict[str, float], int]:
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        match = _RAW.match(line)
        if not match:
            continue
        frames = []
        for frame in match.group(1).split(";"):
            parsed = _FRAME.match(frame)
            frames.append((parsed.group(1), parsed.group(2)) if parsed else (frame, ""))
        component = ours_component(frames[::-1])
        if component is not None:
            counts[component] += int(match.group(2))
    total = sum(counts.values())
    return {name: n / total for name, n in counts.items()}, total


def run_window(data: Path) -> tuple[float, float]:
    """The event loop's run in a perf recording of clients.py: from the first sample in the
    C extension's record functions (the first record appended; the connection before it is
    short) to the last sample. Before it: interpreter start, imports, making the records."""
    done = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym,dso"],
                          capture_output=True, text=True, check=True, timeout=300)
    first = last = None
    for line in done.stdout.splitlines():
        stamp = line.split(":", 1)[0].strip()
        try:
            when = float(stamp)
        except ValueError:
            continue
        last = when
        if first is None and "_c.cpython" in line and ("writer_" in line or "fields_" in line):
            first = when
    if first is None or last is None:
        raise RuntimeError(f"no sample of the record path in {data}")
    return first, last


def perf_kinds(data: Path) -> dict[str, float]:
    """Shares of the run's perf samples by kind of code (the kernel by what for), and of the
    C extension by function."""
    kinds: collections.Counter[str] = collections.Counter()
    for share, _, dso, symbol in perf_rows(data, run_window(data)):
        kind = kind_of(dso, symbol)
        kinds[f"{kind}: {symbol}" if kind == "our C extension" else kind] += share
    total = sum(kinds.values())
    return {k: v / total for k, v in kinds.items()}


# The record encoder's functions in _c.c (and the murmur2 partitioner's), those not inlined.
C_ENCODER = ("writer_", "murmur2", "py_murmur2", "partition_for_key", "py_partition_for_key",
             "partition_of", "put_", "varint_size", "uvarint_size", "zigzag", "prefix_size",
             "optional_bytes")
# py-spy's samples in system calls: it counts a thread that waits for a core as running, and
# a busy machine preempts it mostly on the way out of a system call, so these (and the C
# encoder, which it also overstated 3-10x) are replaced by perf's figures, which count only
# time on a core.
SYSCALLS = ("socket writes", "socket reads", "event loop: polling")


def ours_runs(shape: str, kafka: ApacheKafka, records: int, out: Path, pyspy: str) -> dict:
    _, scenario, _ = SHAPES[shape]
    runs = {}
    for mode in ("plain", "profiled", "perf"):
        topic = f"profile-{shape}-ours-{mode}"
        kafka.create_topic(topic, 6)
        cmd = [sys.executable, str(ROOT / "benchmarks" / "clients.py"), "aioproducer", scenario,
               "--bootstrap", kafka.bootstrap, "--topic", topic, "--records", str(records),
               "--acks", "1", "--uvloop"]
        if mode == "profiled":
            cmd = [pyspy, "record", "--native", "--rate", "500", "--format", "raw",
                   "--full-filenames", "--output", str(out / f"ours-{shape}.pyspy.txt"), "--",
                   *cmd]
        elif mode == "perf":
            cmd = ["perf", "record", "-q", "-F", "3999", "-o",
                   str(out / f"ours-{shape}.perf.data"), "--", *cmd]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"ours {shape} {mode}: {done.stderr[-2000:]}")
        line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
        runs[mode] = json.loads(line)
        runs[mode].pop("latencies")
        runs[mode]["load"] = os.getloadavg()[0]
    return runs


def ours_analysis(shape: str, records: int, out: Path, runs: dict) -> dict:
    """CPU per record from the plain run; the kernel (by what for) and the C encoder from
    perf; the rest split as py-spy's samples outside system calls and the encoder."""
    cpu_us = runs["plain"]["cpu_run"] / records * 1e6
    shares, samples = pyspy_shares(out / f"ours-{shape}.pyspy.txt")
    kinds = perf_kinds(out / f"ours-{shape}.perf.data")
    components = {k: v * cpu_us for k, v in kinds.items() if k.startswith("kernel: ")}
    components["the C encoder"] = cpu_us * sum(
        v for k, v in kinds.items()
        if k.startswith("our C extension: ") and k.split(": ", 1)[1].startswith(C_ENCODER))
    rest = {k: v for k, v in shares.items() if k not in SYSCALLS and k != "the C encoder"}
    left = cpu_us - sum(components.values())
    for name, share in rest.items():
        components[name] = left * share / sum(rest.values())
    return {"records": records, "cpu_run_us": cpu_us, "seconds": runs["plain"]["seconds"],
            "pyspy_samples": samples, "pyspy_shares": shares, "perf_kinds": kinds,
            "components_us": components, "runs": runs}


# Both clients' components under the roles they play per record, for the side-by-side table
# (first match of the component's name; Java's thread prefix is part of the name).
ROLES = [
    (r"^JIT$", "JIT compiler (Java)"),
    (r"^GC$|cyclic GC", "garbage collection"),
    (r"harness|user code", "user code (the loop, making the record)"),
    (r"event loop and scheduling", "event loop, task steps (ours)"),
    (r"^caller: (KafkaProducer|metadata|serialization|partitioner|metrics)|enqueue's Python",
     "the send()/enqueue() call: checks, partitioner, metadata"),
    (r"^caller: (record format|CRC)|the C encoder", "record encoding"),
    (r"^caller: (RecordAccumulator|buffer pool)", "accumulator append (Java: batch, lock)"),
    (r"^caller: the record's future|Future protocol \(our handle",
     "the record's future: make, wait, complete (ours: all of it)"),
    (r"^sender thread: completing", "completing records: futures, callbacks, wake-ups (Java)"),
    (r"Future protocol / gather", "asyncio's gather (ours)"),
    (r"^sender thread: (drain|CRC)", "drain and close batches (Java)"),
    (r"^sender thread: (Sender|request|metrics|selector)|sender task",
     "sender: requests, responses, network client"),
    (r"^caller: (JVM|native|other Java)", "caller thread: JVM runtime, native code"),
    (r"^sender thread: (JVM|native|other Java)", "sender thread: JVM runtime, native code"),
    (r"kernel: futex|kernel: scheduler", "kernel: parking, waking, context switches"),
    (r"kernel", "kernel: socket I/O, epoll, page faults, syscalls"),
]


def by_role(components: dict[str, float]) -> dict[str, float]:
    roles: collections.Counter[str] = collections.Counter()
    for name, us in components.items():
        role = next((r for pattern, r in ROLES if re.search(pattern, name)), "other")
        roles[role] += us
    return roles


def side_by_side(java_components: dict[str, float], ours: dict[str, float]) -> str:
    java_roles, our_roles = by_role(java_components), by_role(ours)
    lines = ["| per record, us of CPU | Java | aioproducer |", "|---|---:|---:|"]
    for role in [r for _, r in ROLES] + ["other"]:
        if role in java_roles or role in our_roles:
            j, o = java_roles.get(role), our_roles.get(role)
            lines.append(f"| {role} | {'-' if j is None else f'{j:.2f}'} | "
                         f"{'-' if o is None else f'{o:.2f}'} |")
    lines.append(f"| all | {sum(java_roles.values()):.2f} | {sum(our_roles.values()):.2f} |")
    return "\n".join(lines)


def table(title: str, components: dict[str, float], total: float) -> str:
    lines = [f"{title}: {total:.2f} us of CPU per record", "", "| component | us/record | share |",
             "|---|---:|---:|"]
    whole = sum(components.values())
    for name, us in sorted(components.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {us:.2f} | {us / whole:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--records", type=int, default=0, help="instead of each shape's own")
    parser.add_argument("--out", type=Path, default=Path("/tmp/yardstick-profile"))
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--reanalyze", action="store_true",
                        help="no runs: the tables again from --out's recordings")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "profile.json"
    results = json.loads(saved.read_text()) if args.reanalyze else {}
    with contextlib.ExitStack() as stack:
        kafka = None if args.reanalyze else stack.enter_context(ApacheKafka(nodes=1))
        for shape in args.shapes.split(","):
            if args.reanalyze:
                if shape not in results:
                    continue
                r = results[shape]
                records = r["java"]["records"]
                java_runs_, ours_runs_ = r["java"]["runs"], r["ours"]["runs"]
            else:
                assert kafka is not None
                records = args.records or SHAPES[shape][2]
                load_before = os.getloadavg()
                started = time.strftime("%H:%M:%S", time.gmtime())
                java_runs_ = java_runs(shape, kafka, records, args.out)
                ours_runs_ = ours_runs(shape, kafka, records, args.out, args.py_spy)
                r = results[shape] = {"load": [load_before, os.getloadavg()],
                                      "started_utc": started}
            r["java"] = java_analysis(shape, records, args.out, java_runs_)
            r["ours"] = ours_analysis(shape, records, args.out, ours_runs_)
            saved.write_text(json.dumps(results, indent=1))
            print(f"## {TITLES[shape]} ({records:,} records, from {r['started_utc']} UTC, load "
                  f"{r['load'][0][0]:.1f} -> {r['load'][1][0]:.1f})\n")
            print(table("Java", r["java"]["components_us"], r["java"]["cpu_run_us"]) + "\n")
            print(table("aioproducer", r["ours"]["components_us"], r["ours"]["cpu_run_us"])
                  + "\n")
            print(side_by_side(r["java"]["components_us"], r["ours"]["components_us"]) + "\n",
                  flush=True)


if __name__ == "__main__":
    main()
