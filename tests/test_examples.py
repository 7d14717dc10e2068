"""Every example runs as written (each starts its own embedded broker)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, timeout: float = 120, **env: str) -> str:
    import os

    environment = {k: v for k, v in os.environ.items() if k != "AIOPRODUCER_BOOTSTRAP"}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                          text=True, timeout=timeout, env={**environment, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_quickstart():
    out = _run("quickstart.py")
    assert "10000 of 10000 acknowledged" in out


def test_transactions_example():
    out = _run("transactions.py")
    assert "committed 100 records" in out and "aborted" in out


@pytest.mark.skipif(shutil.which("java") is None, reason="PySpark needs a Java runtime (17)")
def test_spark_streaming_example():
    pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    out = _run("spark_streaming.py", timeout=240, EXAMPLE_SECONDS="8")
    assert "micro-batch" in out and " records" in out


def test_cli_perf_on_its_own_broker():
    done = subprocess.run([sys.executable, "-m", "aioproducer", "perf", "--num-records", "20000",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"records": 20000' in done.stdout and '"sampled_failures": 0' in done.stdout


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aioproducer", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_cli_produce_lines_and_json(broker, topic_factory, tmp_path):
    from tests.support.readback import consume_all

    topic = topic_factory(2)
    config = tmp_path / "producer.properties"
    config.write_text("# settings as Kafka's tools take them\nlinger.ms=1\nacks = all\n")
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--key-separator", ":",
                "--producer.config", str(config), stdin="k1:one\nk2:two\n")
    assert done.returncode == 0, done.stderr
    assert "2 of 2 records produced" in done.stderr
    lines = '{"value": {"n": 3}, "key": "k3", "headers": {"h": "x"}, "partition": 1}\n' \
            '{"value": "four", "key": null}\n'
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--format", "json",
                stdin=lines)
    assert done.returncode == 0, done.stderr
    got = {r.value: r for r in consume_all(broker.bootstrap, topic, expected=4)}
    assert got[b"one"].key == b"k1" and got[b"two"].key == b"k2"
    assert got[b'{"n": 3}'].partition == 1 and got[b'{"n": 3}'].headers == [("h", b"x")]
    assert got[b"four"].key is None


def test_cli_produce_reports_bad_input(broker, topic):
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--format", "json",
                stdin="not json\n")
    assert done.returncode == 1 and "line 1 is not JSON" in done.stderr
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap,
                "--producer-props", "lingr.ms=5", stdin="x\n")
    assert done.returncode == 1 and "did you mean 'linger_ms'" in done.stderr
