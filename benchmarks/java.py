"""The Java yardsticks for run.py: Kafka's own ProducerPerformance and Bench.java.

Maven resolves benchmarks/java/pom.xml (kafka-clients and kafka-tools 4.4.0) into a cache
directory, and javac compiles Bench.java there; both are redone when their source changes.
Nothing built is committed. A Java run prints the same JSON line as clients.py, with the JVM's
start-up and the warm-up records' time apart from the timed (steady-state) phase.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent / "java"
CLIENTS = {"java-perf": "perf", "java-async": "async", "java-latency": "latency",
           "java-threads": "threads"}


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aioproducer-benchmarks" / "java"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def classpath() -> str:
    """Resolve the jars and compile Bench.java (once per change of pom.xml or Bench.java)."""
    for tool in ("java", "javac", "mvn"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the Java yardsticks need {tool} on PATH")
    lib = _cache() / f"lib-{_digest(HERE / 'pom.xml')}"
    if not (lib / ".done").exists():
        subprocess.run(["mvn", "-q", "-B", "-f", str(HERE / "pom.xml"),
                        "dependency:copy-dependencies", f"-DoutputDirectory={lib}"],
                       check=True, timeout=600)
        (lib / ".done").touch()
    classes = _cache() / f"classes-{_digest(HERE / 'Bench.java')}"
    if not (classes / "Bench.class").exists():
        subprocess.run(["javac", "-d", str(classes), "-cp", f"{lib}/*",
                        str(HERE / "Bench.java")], check=True, timeout=300)
    return f"{lib}/*:{classes}"


def spark_kafka_jars(spark_version: str) -> str:
    """Spark's Kafka sink and what it needs beyond PySpark's own jars, as spark.jars takes
    them: spark-sql-kafka-0-10 and its token provider, kafka-clients, commons-pool2."""
    pom = HERE / "spark-kafka-pom.xml"
    lib = _cache() / f"spark-kafka-{spark_version}-{_digest(pom)}"
    if not (lib / ".done").exists():
        done = subprocess.run(["mvn", "-q", "-B", "-f", str(pom), f"-Dspark.version={spark_version}",
                               "dependency:copy-dependencies", "-DincludeScope=runtime",
                               f"-DoutputDirectory={lib}"], capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise RuntimeError(f"Maven could not resolve spark-sql-kafka-0-10 {spark_version} "
                               f"(not on Maven Central? try --spark-kafka-version): "
                               f"{done.stdout[-500:]}")
        (lib / ".done").touch()
    wanted = ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10", "kafka-clients",
              "commons-pool2")
    return ",".join(str(jar) for jar in sorted(lib.glob("*.jar")) if jar.name.startswith(wanted))


def command(client: str, bootstrap: str, topic: str, records: int, warmup: int,
            keyless: bool, acks: str, rate: float) -> list[str]:
    """The Java process for one run: `records` timed records after `warmup` warm-up ones."""
    java = ["java", "-Xmx1g", "-cp", classpath()]
    if client == "java-perf":
        # Fire and forget: send() with ProducerPerformance's own latency-recording callback.
        keys = [] if keyless else ["--key-distribution", "range", "--record-key-range",
                                   "100000"]
        return [*java, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                "--bootstrap-server", bootstrap, "--num-records", str(warmup + records),
                "--warmup-records", str(warmup), "--record-size", "100", "--throughput", "-1",
                "--reporting-interval", "600000", *keys, "--command-property", f"acks={acks}",
                "enable.idempotence=false", "linger.ms=5", "batch.size=16384"]
    return [*java, "Bench", CLIENTS[client], "--bootstrap", bootstrap, "--topic", topic,
            "--records", str(records), "--warmup", str(warmup), "--acks", acks,
            "--rate", str(rate), *(["--keyless"] if keyless else [])]


_STEADY = re.compile(r"^(\d+) steady state records sent, ([\d.]+) records/sec", re.MULTILINE)
_TOTAL = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec", re.MULTILINE)


def perf_result(stdout: str, records: int) -> dict:
    """ProducerPerformance's summary lines as a run result: the steady-state line (after the
    warm-up records) for the timed phase, the whole-run line for warm-up included."""
    steady = _STEADY.search(stdout)
    total = _TOTAL.findall(stdout)
    if steady is None or not total:
        raise ValueError(f"no summary line in ProducerPerformance's output: {stdout[-300:]!r}")
    sent, total_rate = int(total[-1][0]), float(total[-1][1])
    return {"seconds": records / float(steady.group(2)), "whole_seconds": sent / total_rate,
            "latencies": []}
