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
