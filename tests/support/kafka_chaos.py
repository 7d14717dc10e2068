"""Streams and faults on three real Apache Kafka nodes (aioproducer.testing.ApacheKafka), shared
by the chaos and rolling-restart tests (tests/real_kafka) and the soak (benchmarks/kafka_soak.py).

A stream writes keyed, numbered records ("key:seq:txn") from one producer, idempotent or
transactional, while faults run in a thread of their own (each fault blocks until it is done:
a node restarted is registered and back in every ISR). Its record of each record's fate is
then checked against what librdkafka's consumer reads back, read_committed for transactions:
nothing acknowledged lost, nothing twice, every key's records in order, each committed
transaction whole, no aborted one, every future ended within delivery_timeout_ms.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from aioproducer import Producer
from aioproducer.testing import ApacheKafka
from tests.support.readback import consume_all

KEYS = 12
PARTITIONS = 6
TOPIC_CONFIG = {"min.insync.replicas": 2, "unclean.leader.election.enable": "false"}
# request_timeout_ms is short so a pause outlasts it in a short test; delivery_timeout_ms is
# long enough to ride out any single fault (a restart takes ~5-10 s on this machine).
SETTINGS = dict(acks="all", linger_ms=5, request_timeout_ms=3_000, delivery_timeout_ms=60_000,
                retry_backoff_ms=50, retry_backoff_max_ms=500, reconnect_backoff_max_ms=500,
                max_block_ms=30_000)


def value(key: int, seq: int, txn: int) -> bytes:
    return b"%02d:%07d:%06d:" % (key, seq, txn) + b"x" * 50


@dataclass
class Faults:
    """What was done to the cluster, and what the brokers' metadata showed meanwhile."""

    kills: int = 0
    stops: int = 0
    pauses: int = 0
    elections: int = 0
    throttles: int = 0
    cuts: int = 0  # connections cut by the kernel (ss -K)
    leader_changes: int = 0  # partition leaders seen to change in the brokers' metadata
    log: list[str] = field(default_factory=list)
    cut_skipped: str | None = None
    # (what, from, to) in time.monotonic(): a node down until it is back in every ISR.
    phases: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class StreamResult:
    transactional: bool
    sent: dict[int, list[int]]  # key -> seqs enqueued, in order
    committed: set[int]  # transactions committed (transactional)
    aborted: set[int]  # transactions aborted (by the application, or after a failed commit)
    unknown: set[int]  # transactions whose commit raised: committed or not, but whole
    txn_of: dict[tuple[int, int], int]  # (key, seq) -> transaction
    acked: set[tuple[int, int]]  # (key, seq) acknowledged
    failed: list[tuple[tuple[int, int], BaseException]]
    app_errors: list[BaseException]  # errors a transaction call raised to the application
    waits: list[float]  # each acknowledged record's enqueue-to-ack time, seconds
    enqueued: list[float]  # ... and when it was enqueued (time.monotonic()), in step
    longest_future: float  # the longest any record's future took to end, seconds
    metrics: Any = None

    @property
    def records(self) -> int:
        return sum(len(s) for s in self.sent.values())


class LeaderWatch:
    """Polls the brokers' metadata (librdkafka's admin client, in a thread) and counts each
    partition leader change it sees; also answers ISR questions."""

    def __init__(self, bootstrap: str, topics: list[str], faults: Faults) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000})
        self.topics = topics
        self._faults = faults
        self.leaders: dict[tuple[str, int], int] = {}
        self.isrs: dict[tuple[str, int], list[int]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="LeaderWatch")

    def poll(self) -> bool:
        try:
            metadata = self._admin.list_topics(timeout=2)
        except Exception:
            return False
        with self._lock:
            for topic in self.topics:
                if topic not in metadata.topics:
                    return False
                for p, meta in metadata.topics[topic].partitions.items():
                    before = self.leaders.get((topic, p))
                    if meta.leader >= 0 and before is not None and before >= 0 and \
                            meta.leader != before:
                        self._faults.leader_changes += 1
                    if meta.leader >= 0 or before is None:
                        self.leaders[(topic, p)] = meta.leader
                    self.isrs[(topic, p)] = list(meta.isrs)
        return True

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            self.poll()

    def __enter__(self) -> "LeaderWatch":
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def leader_of(self, partition: int = 0) -> int:
        self.poll()
        return self.leaders[(self.topics[0], partition)]

    def wait_in_isr(self, node: int, timeout: float = 90.0) -> float:
        """Until `node` is in every ISR of the topics; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.poll() and len(self.isrs) == PARTITIONS * len(self.topics) and all(
                    node in isr for isr in self.isrs.values()):
                return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"node {node} not back in every ISR of {self.topics} within "
                             f"{timeout} s: {self.isrs}")


def cut_connections(kafka: ApacheKafka, node: int) -> int:
    """Cut every TCP connection to a node's client port at once (the kernel aborts them:
    `ss -K`, needs root and CONFIG_INET_DIAG_DESTROY); returns how many were cut, or raises
    RuntimeError saying why it cannot."""
    ss = shutil.which("ss")
    if ss is None:
        raise RuntimeError("no ss (iproute2) to cut connections with")
    port = kafka.bootstrap_for("PLAINTEXT", [node]).rsplit(":", 1)[1]
    result = subprocess.run([ss, "-K", "-t", "dst", "127.0.0.1", "dport", "=", f":{port}"],
                            capture_output=True, text=True, timeout=10)
    if result.returncode:
        raise RuntimeError(f"ss -K failed: {result.stderr.strip()}")
    cut = sum(1 for line in result.stdout.splitlines()[1:] if "ESTAB" in line)
    if "Operation not permitted" in result.stderr:
        raise RuntimeError("ss -K is not permitted here (needs root)")
    return cut


class FaultPlan:
    """The faults, each a blocking step run in a thread; `steps` names them in order."""

    def __init__(self, kafka: ApacheKafka, watch: LeaderWatch, faults: Faults, client_id: str,
                 pause_s: float, quota_bytes: int = 8_000, quota_s: float = 4.0) -> None:
        self.kafka, self.watch, self.faults = kafka, watch, faults
        self.client_id, self.pause_s = client_id, pause_s
        self.quota_bytes, self.quota_s = quota_bytes, quota_s

    def _say(self, text: str) -> None:
        self.faults.log.append(f"{time.strftime('%H:%M:%S')} {text}")

    def restart(self, node: int, how: str,
                while_down: tuple[Callable[[], None], ...] = ()) -> None:
        """Stop `node` (SIGTERM or SIGKILL), run `while_down` (or let the stream run on two
        nodes for a second), start it again, and wait until it is in every ISR."""
        began = time.monotonic()
        if how == "kill":
            self.kafka.kill_node(node)
            self.faults.kills += 1
        else:
            self.kafka.stop_node(node)
            self.faults.stops += 1
        self._say(f"{how} node {node}")
        for step in while_down:
            step()
        if not while_down:
            time.sleep(1.0)
        self.kafka.start_node(node)
        waited = self.watch.wait_in_isr(node)
        self.faults.phases.append((how, began, time.monotonic()))
        self._say(f"node {node} back in every ISR ({waited:.1f} s after it registered)")

    def kill_leader(self) -> None:
        self.restart(self.watch.leader_of(0), "kill")

    def stop_leader(self) -> None:
        """SIGTERM a leader; while it is down, the quota and a cut on the two left."""
        self.restart(self.watch.leader_of(1), "stop", (self.throttle, self.cut))

    def pause_leader(self) -> None:
        node = self.watch.leader_of(2)
        self.kafka.pause_node(node)
        self.faults.pauses += 1
        self._say(f"pause node {node} for {self.pause_s} s")
        time.sleep(self.pause_s)
        self.kafka.resume_node(node)
        waited = self.watch.wait_in_isr(node)
        self._say(f"node {node} resumed, back in every ISR after {waited:.1f} s")

    def elect(self) -> None:
        self.kafka.elect_leaders()  # every partition of every topic
        self.faults.elections += 1
        self._say("preferred leader election")

    def throttle(self) -> None:
        self.kafka.set_quota(self.client_id, self.quota_bytes)
        self.faults.throttles += 1
        self._say(f"quota {self.quota_bytes} B/s for {self.client_id}")
        time.sleep(self.quota_s)
        self.kafka.set_quota(self.client_id)
        self._say("quota removed")

    def cut(self) -> None:
        if self.faults.cut_skipped is not None:
            return
        node = self.watch.leader_of(3)
        if node < 0:
            return
        try:
            n = cut_connections(self.kafka, node)
        except RuntimeError as exc:
            self.faults.cut_skipped = str(exc)
            self._say(f"cut skipped: {exc}")
            return
        self.faults.cuts += n
        self._say(f"cut {n} connections to node {node}")

    def chaos_round(self) -> list[Callable[[], None]]:
        return [self.kill_leader, self.cut, self.stop_leader, self.pause_leader, self.elect]

    def rolling(self, how: str, nodes: list[int] | None = None) -> list[Callable[[], None]]:
        """Each node in turn (`how`: "stop" for SIGTERM, "kill" for SIGKILL) down and back,
        the next only once the last is in every ISR again."""
        return [lambda node=node: self.restart(node, how)  # type: ignore[misc]
                for node in (range(self.kafka.nodes) if nodes is None else nodes)]


async def run_faults(steps: list[Callable[[], None]], gap_s: float = 0.5) -> None:
    """Each step in a thread, one after another, `gap_s` apart."""
    for step in steps:
        await asyncio.sleep(gap_s)
        await asyncio.to_thread(step)
    await asyncio.sleep(gap_s)


async def stream(producer: Producer, topic: str, done: asyncio.Event, *, transactional: bool,
                 per_round: int = 24, gap_s: float = 0.05, abort_every: int | None = 7,
                 limit_s: float = 3600) -> StreamResult:
    """Write until `done` is set: rounds of `per_round` records over KEYS keys, `gap_s` apart;
    transactional: one transaction per round, every `abort_every`-th aborted on purpose.
    Transaction calls that raise are counted (app_errors) and the transaction aborted."""
    loop = asyncio.get_running_loop()
    delivery_s = producer.config.delivery_timeout_ms / 1000
    result = StreamResult(transactional, {k: [] for k in range(KEYS)}, set(), set(), set(),
                          {}, set(), [], [], [], [], 0.0)
    seq = [0] * KEYS
    pending: set[asyncio.Future[Any]] = set()

    def track(ident: tuple[int, int], future: Any, started: float) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(future)

        def ended(t: asyncio.Future[Any]) -> None:
            took = time.monotonic() - started
            result.longest_future = max(result.longest_future, took)
            if t.cancelled():
                result.failed.append((ident, asyncio.CancelledError()))
            elif t.exception() is not None:
                result.failed.append((ident, t.exception()))  # type: ignore[arg-type]
            else:
                result.acked.add(ident)
                result.waits.append(took)
                result.enqueued.append(started)
            pending.discard(t)
        task.add_done_callback(ended)
        pending.add(task)
        return task

    async def write_round(txn: int) -> list[asyncio.Future[Any]]:
        tracked = []
        for i in range(per_round):
            key = i % KEYS
            ident = (key, seq[key])
            seq[key] += 1
            started = time.monotonic()
            future = await producer.enqueue(topic, value(key, ident[1], txn), key=b"%d" % key)
            result.sent[key].append(ident[1])
            result.txn_of[ident] = txn
            tracked.append(track(ident, future, started))
        return tracked

    txn = 0
    give_up = loop.time() + limit_s
    while not done.is_set() and loop.time() < give_up:
        txn += 1
        if not transactional:
            await write_round(txn)
        else:
            abort = abort_every is not None and txn % abort_every == 0
            tracked: list[asyncio.Future[Any]] = []
            try:
                producer.begin_transaction()
                tracked = await write_round(txn)
                if abort:
                    await producer.abort_transaction()
                    result.aborted.add(txn)
                else:
                    await producer.commit_transaction()
                    result.committed.add(txn)
            except Exception as exc:
                result.app_errors.append(exc)
                result.unknown.add(txn)
                try:
                    await producer.abort_transaction()
                except Exception as abort_error:
                    result.app_errors.append(abort_error)
            if tracked:
                await asyncio.wait(tracked, timeout=delivery_s + 5)
        await asyncio.sleep(gap_s)
    if pending:
        await asyncio.wait(set(pending), timeout=delivery_s + 5)
    result.metrics = producer.metrics()
    return result


@dataclass
class Check:
    """What the read-back found."""

    read: int
    lost: list[tuple[int, int]]
    duplicates: int
    reordered: int
    torn_transactions: list[int]  # committed (or unknown) transactions not read back whole
    aborted_seen: list[int]  # aborted transactions with a record in the read_committed view
    unexpected: list[tuple[int, int]]  # read but never acknowledged nor in a committed txn


def check(bootstrap: str, topic: str, result: StreamResult, timeout: float = 120) -> Check:
    """Read everything back with librdkafka (read_committed for transactions) and compare
    (waiting up to `timeout` for all that is expected)."""
    if result.transactional:
        expected_ids = {ident for ident, t in result.txn_of.items() if t in result.committed}
    else:
        expected_ids = set(result.acked)
    isolation = "read_committed" if result.transactional else "read_uncommitted"
    stored = consume_all(bootstrap, topic, len(expected_ids), timeout=timeout,
                         isolation_level=isolation)
    by_key: dict[int, list[int]] = collections.defaultdict(list)
    txn_seen: dict[int, int] = collections.Counter()
    for record in stored:
        key, seq, txn = (int(part) for part in record.value.split(b":")[:3])
        by_key[key].append(seq)
        txn_seen[txn] += 1
    read_ids = {(k, s) for k, seqs in by_key.items() for s in seqs}
    duplicates = sum(len(seqs) - len(set(seqs)) for seqs in by_key.values())
    reordered = sum(1 for seqs in by_key.values() for a, b in zip(seqs, seqs[1:]) if b < a)
    txn_size = collections.Counter(result.txn_of.values())
    torn, aborted_seen = [], []
    if result.transactional:
        for txn in sorted(result.committed | result.unknown):
            seen = txn_seen.get(txn, 0)
            if (txn in result.committed and seen != txn_size[txn]) or \
                    (txn in result.unknown and seen not in (0, txn_size[txn])):
                torn.append(txn)
        aborted_seen = sorted(t for t in result.aborted if txn_seen.get(t))
        allowed = expected_ids | {i for i, t in result.txn_of.items() if t in result.unknown}
    else:
        # A record whose future failed may still have been written (its ack was lost).
        allowed = set(result.txn_of)
    return Check(len(stored), sorted(expected_ids - read_ids), duplicates, reordered, torn,
                 aborted_seen, sorted(read_ids - allowed))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def waits_during(result: StreamResult, faults: Faults, how: str | None = None) -> list[float]:
    """The waits of the records enqueued while a node was down (`how`: "stop" or "kill"
    only; None: either), until it was back in every ISR."""
    spans = [(a, b) for what, a, b in faults.phases if how is None or what == how]
    return [took for started, took in zip(result.enqueued, result.waits)
            if any(a <= started <= b for a, b in spans)]


def wait_figures(waits: list[float]) -> str:
    return (f"{len(waits)} records, p50 {percentile(waits, 0.5) * 1000:.0f} ms, p99 "
            f"{percentile(waits, 0.99) * 1000:.0f} ms, max {max(waits, default=0) * 1000:.0f} ms")


def summary(name: str, result: StreamResult, faults: Faults, found: Check) -> str:
    m = result.metrics
    waits = result.waits
    failed = [f for f in result.failed if result.txn_of[f[0]] not in result.aborted]
    extra = (f", {len(result.committed)} transactions committed, {len(result.aborted)} aborted "
             f"on purpose, {len(result.unknown)} failed commits" if result.transactional else "")
    return (f"{name}: {result.records} records{extra}; {faults.kills} kills, {faults.stops} "
            f"SIGTERM stops, {faults.pauses} pauses, {faults.elections} preferred elections, "
            f"{faults.throttles} quotas, {faults.cuts} connections cut"
            f"{' (cut skipped: ' + faults.cut_skipped + ')' if faults.cut_skipped else ''}, "
            f"{faults.leader_changes} leader changes seen; producer: {m.retries} retries, "
            f"{m.leader_redirects} leader redirects, {m.produce_throttle_time_ms} ms throttled; "
            f"{len(failed)} records failed (outside transactions aborted on purpose), "
            f"{len(result.app_errors)} errors to the "
            f"application; read back {found.read}: {len(found.lost)} lost, {found.duplicates} "
            f"duplicates, {found.reordered} reordered, {len(found.torn_transactions)} torn "
            f"transactions, {len(found.aborted_seen)} aborted seen; longest future "
            f"{result.longest_future:.1f} s; record waits (enqueue to ack): all "
            f"{wait_figures(waits)}; while a node was down after SIGTERM "
            f"{wait_figures(waits_during(result, faults, 'stop'))}; after SIGKILL "
            f"{wait_figures(waits_during(result, faults, 'kill'))}")


@dataclass
class Run:
    """One stream's outcome, with what was read back."""

    name: str
    topic: str
    result: StreamResult
    found: Check


async def run_streams(kafka: ApacheKafka, plan_steps: Callable[[FaultPlan], list[Callable[[], None]]],
                      *, kinds: tuple[str, ...] = ("idempotent", "transactional"),
                      abort_every: int | None = 7, pause_s: float | None = None,
                      gap_s: float = 0.5, repeat_until: float | None = None,
                      ) -> tuple[list[Run], Faults]:
    """A topic and a producer per kind of stream, all writing at once while the plan's
    faults run (again and again until `repeat_until`, a loop time, when given); then each
    stream read back and checked."""
    topics = {kind: f"{kind[:5]}-{uuid.uuid4().hex[:8]}" for kind in kinds}
    for topic in topics.values():
        kafka.create_topic(topic, PARTITIONS, replication_factor=3, config=TOPIC_CONFIG)
    client_id = f"chaos-{uuid.uuid4().hex[:8]}"
    faults = Faults()
    loop = asyncio.get_running_loop()
    with LeaderWatch(kafka.bootstrap, list(topics.values()), faults) as watch:
        async with contextlib.AsyncExitStack() as stack:
            producers = {}
            for kind in kinds:
                extra = ({"transactional_id": f"chaos-{uuid.uuid4()}"}
                         if kind == "transactional" else {})
                producers[kind] = await stack.enter_async_context(
                    Producer(kafka.bootstrap, client_id=client_id, **SETTINGS, **extra))
            plan = FaultPlan(kafka, watch, faults, client_id,
                             pause_s=pause_s or SETTINGS["request_timeout_ms"] / 1000 + 1.5)
            done = asyncio.Event()
            writing = {kind: asyncio.create_task(stream(
                producers[kind], topics[kind], done, transactional=kind == "transactional",
                abort_every=abort_every)) for kind in kinds}
            try:
                while True:
                    await run_faults(plan_steps(plan), gap_s)
                    if repeat_until is None or loop.time() >= repeat_until:
                        break
            finally:
                done.set()
            results = {kind: await task for kind, task in writing.items()}
    runs = []
    for kind in kinds:
        found = await asyncio.to_thread(check, kafka.bootstrap, topics[kind], results[kind])
        runs.append(Run(kind, topics[kind], results[kind], found))
    return runs, faults
