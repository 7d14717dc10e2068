"""The killed-driver streaming run: a Structured Streaming query (tests/support/spark_stream_job.py,
a driver process of its own) writes text files to a topic, two files of 400 lines per
micro-batch; its driver is SIGKILLed (its process group: the Python driver and its JVM;
PySpark's worker daemon, in a group of its own, ends its Python workers when the JVM is gone)
in the middle of a micro-batch, restarted from its checkpoint, killed again as many times as asked,
then run to the end. What each line became is read back twice: from the raw batches and
control markers (committed, aborted, open, or outside transactions) and by librdkafka's
read_committed consumer, the view a user's application has.

Kill k holds the task of file f(4k+5), line 200 (micro-batch 2k+2, its second Spark
partition; the first, file f(4k+4), is left to finish). The kill waits until that state is
reached: the task held, every line of the files before it at the broker (in committed
transactions for the data source, as plain records for Spark's sink) and, when asked, some
of the held file's lines sent (lines padded to a few kB reach the sink before the hold; see
spark_stream_job.py). So what a restart finds does not depend on when the kill landed.

Shared by tests/test_spark.py (Tansu), tests/real_kafka/test_spark.py and
benchmarks/spark_duplicates.py (Spark's own sink beside the data source).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aioproducer.testing._watchdog import Watchdog
from tests.support.readback import OutcomeReader, Outcomes, consume_all

ROOT = Path(__file__).resolve().parent.parent.parent
PER_FILE = 400
HELD_LINE = 200
PARTITIONS = 2  # of the topic


def line_id(value: bytes) -> bytes:
    """A record's line, without its padding: b"f05-0200"."""
    return value[:8]


@dataclass
class Kill:
    """The state a kill found: the checkpoint's micro-batches planned (offsets) and done
    (commits), the files with lines in committed transactions or plain records, and how
    many of the held file's lines were at the broker (sent before the hold, in an open
    transaction for the data source)."""

    planned: list[int]
    done: list[int]
    files_written: list[str]
    held_lines_sent: int


@dataclass
class Run:
    expected: set[bytes]  # every input line's id
    kills: list[Kill] = field(default_factory=list)
    report: dict = field(default_factory=dict)  # the last driver's counters (data source)
    raw: Outcomes | None = None
    read_committed: Counter[bytes] = field(default_factory=Counter)
    seconds: float = 0.0
    phases: list[float] = field(default_factory=list)  # seconds to each kill, to the end
    log: Path | None = None

    @property
    def duplicates(self) -> int:
        """Records in the read_committed view beyond one per line."""
        return sum(self.read_committed.values()) - len(self.read_committed)

    @property
    def missing(self) -> int:
        return len(self.expected - self.read_committed.keys())

    def duplicated_by_file(self) -> dict[str, int]:
        by_file: Counter[str] = Counter()
        for line, count in self.read_committed.items():
            if count > 1:
                by_file[line[:3].decode()] += count - 1
        return dict(sorted(by_file.items()))


def write_input(source: Path, files: int, pad: int) -> set[bytes]:
    """`files` files of PER_FILE lines, "fFF-IIII" then `pad` dots; modified a second apart,
    oldest first (the file source reads them in that order)."""
    source.mkdir(parents=True)
    start = time.time() - files
    for f in range(files):
        path = source / f"part-{f:02d}.txt"
        path.write_text("".join(f"f{f:02d}-{i:04d}{'.' * pad}\n" for i in range(PER_FILE)))
        os.utime(path, (start + f, start + f))
    return {f"f{f:02d}-{i:04d}".encode() for f in range(files) for i in range(PER_FILE)}


def batch_ids(checkpoint: Path, log: str) -> list[int]:
    """The micro-batches in a checkpoint's offsets (planned) or commits (done) log."""
    entries = checkpoint / log
    return sorted(int(p.name) for p in entries.glob("[0-9]*")) if entries.exists() else []


def run(bootstrap: str, topic: str, workdir: Path, *, kills: int = 1, pad: int = 0,
        sink: str = "aioproducer", jars: str | None = None, wait_for_held_lines: bool = False,
        aborted_visible: bool = False, timeout: float = 240.0) -> Run:
    """The whole run on a fresh `topic` of PARTITIONS partitions. `aborted_visible`: the
    broker's read_committed consumers see aborted records (Tansu); `timeout`: for the
    drivers together to reach their kills and the last one its end (one budget, not one
    each: on a loaded machine the first driver's start alone can take minutes). A driver
    that fails, or a state not reached in time, raises AssertionError saying what was
    reached, with the end of the drivers' log."""
    files = 4 * kills + 4
    source, checkpoint, log = workdir / "in", workdir / "checkpoint", workdir / "driver.log"
    result = Run(write_input(source, files, pad), log=log)
    base = [sys.executable, "-m", "tests.support.spark_stream_job", bootstrap, topic,
            str(source), str(checkpoint), "--sink", sink, *(["--jars", jars] if jars else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    watchdog = Watchdog(None)  # kills the drivers if this process dies first
    started = time.monotonic()
    deadline = started + timeout
    try:
        for k in range(kills):
            held_file, signal_file = 4 * k + 5, workdir / f"held-{k}"
            driver = _start(base + ["--hold", f"f{held_file:02d}-{HELD_LINE:04d}",
                                    "--signal", str(signal_file)], env, log, watchdog)
            try:
                before = {f"f{f:02d}".encode() for f in range(held_file)}
                reader = OutcomeReader(bootstrap, topic, PARTITIONS)
                written: set[bytes] = set()
                held: set[bytes] = set()
                while True:
                    if signal_file.exists():
                        raw = reader.read()
                        written = {line_id(v) for v in raw.committed + raw.plain}
                        held = {line_id(v) for v in raw.open + raw.plain + raw.committed
                                if v.startswith(b"f%02d" % held_file)}
                        if all(line[:3] not in before or line in written
                               for line in result.expected) and (held or not wait_for_held_lines):
                            break
                    assert driver.poll() is None and time.monotonic() < deadline, (
                        f"kill {k}: state not reached: "
                        f"{_state(driver, started, signal_file, written, held)}\n{_tail(log)}")
                    time.sleep(0.3)
                result.phases.append(time.monotonic() - started)
                os.killpg(driver.pid, signal.SIGKILL)
            finally:
                _end(driver, watchdog)
            result.kills.append(Kill(batch_ids(checkpoint, "offsets"),
                                     batch_ids(checkpoint, "commits"),
                                     sorted({line[:3].decode() for line in written}),
                                     len(held)))
        driver = _start(base, env, log, watchdog)
        try:
            code = driver.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the last driver did not finish {timeout:.0f} s after the "
                                 f"first started\n{_tail(log)}") from None
        finally:
            _end(driver, watchdog)
        assert code == 0, f"the last driver failed ({code})\n{_tail(log)}"
    finally:
        watchdog.close()
    result.seconds = time.monotonic() - started
    result.phases.append(result.seconds)
    result.report = json.loads(log.read_text().strip().splitlines()[-1])
    result.raw = OutcomeReader(bootstrap, topic, PARTITIONS).read()
    wanted = len(result.raw.committed) + len(result.raw.plain) + (
        len(result.raw.aborted) if aborted_visible else 0)
    consumed = consume_all(bootstrap, topic, expected=wanted, timeout=60,
                           isolation_level="read_committed")
    result.read_committed = Counter(line_id(r.value) for r in consumed)
    return result


def _start(command: list[str], env: dict[str, str], log: Path,
           watchdog: Watchdog) -> subprocess.Popen[bytes]:
    """A driver in a process group of its own (killed whole), watched by the watchdog."""
    with log.open("ab") as out:
        driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    watchdog.watch(driver.pid)
    return driver


def _end(driver: subprocess.Popen[bytes], watchdog: Watchdog) -> None:
    """Its whole group gone (the driver and its JVM), and the watchdog told."""
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(30)
    try:
        os.killpg(driver.pid, signal.SIGKILL)  # what it left behind in its group
    except ProcessLookupError:
        pass
    watchdog.forget(driver.pid)


def _state(driver: subprocess.Popen[bytes], started: float, signal_file: Path,
           written: set[bytes], held: set[bytes]) -> str:
    """What a kill's wait saw, for its failure's message."""
    code = driver.poll()
    ended = f"the driver exited ({code})" if code is not None else "out of time"
    ended += f" {time.monotonic() - started:.0f} s after the first driver started"
    hold = "reached" if signal_file.exists() else "not reached"
    files = sorted({line[:3].decode() for line in written})
    return (f"{ended}; the hold {hold}; files at the broker {files}; {len(held)} of the held "
            "file's lines sent")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
