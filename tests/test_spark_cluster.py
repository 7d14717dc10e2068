"""The data source on a Spark cluster, not local[N]: executors are separate processes with
their own Python, so the package must be shipped to them. Each driver runs as a user's
script in a process of its own (a JVM started once per Python process keeps the environment
it started with)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest

from tests.support.processes import run_in_own_group
from tests.support.readback import consume_all

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def spark_home(tmp_path_factory) -> Path:
    """pyspark's own directory, linked entry by entry: Spark puts its workers' directories
    under SPARK_HOME/work, which must not be the installed package."""
    pyspark = pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    home = tmp_path_factory.mktemp("spark-home")
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return home


def _run_job(spark_home: Path, executor_python: str, *args: str) -> subprocess.CompletedProcess[str]:
    # The driver imports this checkout (python -m, from it); no PYTHONPATH, which the
    # executors would inherit: local-cluster's workers run in the driver's JVM.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env.update(SPARK_HOME=str(spark_home), PYSPARK_PYTHON=executor_python)
    # In a process group of its own: a timeout kills the driver's JVM and the executors too.
    return run_in_own_group([sys.executable, "-m", "tests.support.spark_cluster_job", *args],
                            cwd=ROOT, env=env, timeout=150)


@pytest.mark.timeout(170)  # above the job's own 150 s
def test_package_shipped_with_spark_archives(spark_home, broker, topic_factory, tmp_path):
    """The package goes to the executors in an archive (spark.archives), their Python is
    the driver's interpreter (PYSPARK_PYTHON; its site-packages give the dependencies). The
    tasks run in two executor processes, neither of them the driver, and import the shipped
    copy; every row arrives."""
    archive = tmp_path / "aioproducer.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(ROOT / "aioproducer", "aioproducer",
                filter=lambda info: None if "__pycache__" in info.name else info)
    topic = topic_factory(2)
    done = _run_job(spark_home, sys.executable, broker.bootstrap, topic, "20000", str(archive))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    pids = {pid for pid, _ in report["tasks"]}
    assert len(pids) == 2 and report["driver"] not in pids
    assert all(path.endswith("/shipped/aioproducer/__init__.py") for _, path in report["tasks"])
    got = consume_all(broker.bootstrap, topic, expected=20000, timeout=60)
    assert sorted(int(r.value) for r in got) == list(range(20000))


@pytest.mark.timeout(170)  # above the job's own 150 s
def test_executors_without_the_package_get_one_clear_error(spark_home, broker, topic, tmp_path):
    """The issue's case: the executors start a Python without aioproducer (here a bare venv
    of the same Python version). register() fails at once with one SparkExecutorSetupError
    that says which interpreter lacks what, and how to ship it; no task tracebacks."""
    venv.create(tmp_path / "bare", with_pip=False)
    bare = str(tmp_path / "bare" / "bin" / "python")
    done = _run_job(spark_home, bare, broker.bootstrap, topic, "10")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("aioproducer.integrations.spark.SparkExecutorSetupError: the "
                           f"executors' Python is missing packages: {bare} on "), last
    assert "cannot import pyarrow (No module named 'pyarrow'), " \
           "aioproducer.integrations.spark_source (No module named 'aioproducer')" in last
    assert "spark.archives=env.tar.gz#environment" in last and "PYSPARK_PYTHON" in last
    assert done.stderr.count("Traceback") == 1 and "PythonException" not in done.stderr
    assert consume_all(broker.bootstrap, topic, expected=1, timeout=2) == []
