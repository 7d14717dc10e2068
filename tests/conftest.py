"""Fixtures: a real broker (embedded Tansu, or AIOPRODUCER_BOOTSTRAP), topics, a fault proxy,
a simulated three-node cluster in front of the broker, and the ways a block is cut short (asyncio and anyio, on asyncio's loop and uvloop)."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_asyncio.plugin import PytestAsyncioFunction

from aioproducer.testing import EmbeddedBroker, SimulatedCluster
from tests.support.cancel import WAYS, cut_short
from tests.support.readback import created_with
from tests.support.proxy import FaultProxy
from tests.support.simulated import require_embedded

# CI must run the real-Kafka tier (tests/real_kafka): there a missing Java or Maven fails the
# tier instead of skipping it (aioproducer's pytest plugin reads this).
if os.environ.get("CI") == "true":
    os.environ.setdefault("AIOPRODUCER_REQUIRE_KAFKA", "1")

# The JVM settings of every Spark application the tests start, scripts' too (spark-defaults).
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "support" / "spark-conf"))


class ExternalCluster:
    """A Kafka cluster the user points the suite at with AIOPRODUCER_BOOTSTRAP."""

    is_embedded = False

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, replication_factor=-1)])
        futures[name].result(30)


@pytest.fixture(scope="session")
def broker():
    bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
    if bootstrap:
        yield ExternalCluster(bootstrap)
        return
    with EmbeddedBroker() as embedded:
        embedded.is_embedded = True
        yield embedded


@pytest.fixture
def topic_factory(broker):
    def create(partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        broker.create_topic(name, partitions)
        created_with(name, partitions)  # consume_all reads them all
        return name
    return create


@pytest.fixture
def topic(topic_factory) -> str:
    return topic_factory(1)


@pytest.fixture
def fresh_broker():
    with EmbeddedBroker() as embedded:
        yield embedded


@dataclass
class ProxiedBroker:
    broker: EmbeddedBroker
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.broker.create_topic(name, partitions)


@pytest.fixture
def proxied_broker():
    """A broker of its own that advertises a FaultProxy's address: every client connection
    goes through the proxy. (Embedded only: an external cluster advertises itself.)"""
    with FaultProxy() as proxy, EmbeddedBroker(advertised_port=proxy.port) as embedded:
        proxy.upstream_port = embedded.port
        yield ProxiedBroker(embedded, proxy)


@pytest.fixture
def cluster(broker):
    """Three simulated nodes (ids 1-3) in front of the session's broker: leaders spread over
    them, faults on command (aioproducer.testing.SimulatedCluster). Embedded only: an
    external cluster's own brokers would answer for partitions the nodes say they lead."""
    require_embedded(broker)
    with SimulatedCluster(nodes=3, upstream=broker, lifetime=120) as simulated:
        yield simulated


_SPARK_CUT_SHORT_BY = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def spark(request):
    """One local Spark session per test process: a second session in the same process after
    stop() finds the JVM gateway half gone (py4j errors), as happened when pytest-xdist moved
    between the modules that each had their own."""
    pyspark = pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    # Spark's Python workers must run this interpreter (the one with aioproducer installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (pyspark.sql.SparkSession.builder.master("local[2]")
               .appName("aioproducer-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .getOrCreate())
    yield session
    try:
        session.stop()
    except Exception:
        if _SPARK_CUT_SHORT_BY not in request.config.stash:
            raise  # (else the gateway out of step fails it too: said once, below)


def pytest_runtest_setup(item):
    """A test's timeout that cut a py4j call short leaves the worker's Spark session out of
    step: every later Spark test of the worker would fail with unrelated py4j errors
    (`KeyError: 'c'`, ~25 of them). They fail at once instead, before any fixture (a module's
    own fixtures use the session too), naming the test whose failure is the one to read."""
    cut_short_by = item.config.stash.get(_SPARK_CUT_SHORT_BY, None)
    if cut_short_by is not None and "spark" in getattr(item, "fixturenames", ()):
        pytest.fail(f"this worker's Spark session is out of step: {cut_short_by} timed out "
                    f"inside it (a py4j call cut short); that test's failure is the one to read",
                    pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if (report.failed and "spark" in getattr(item, "fixturenames", ())
            and "from pytest-timeout" in str(report.longrepr)):
        item.config.stash[_SPARK_CUT_SHORT_BY] = item.nodeid
    return report


# -- the fast tier ------------------------------------------------------------------------

# `pytest -m fast`: files that need at most the embedded broker (and the simulated cluster in
# front of it) and take about 2 minutes together, chosen for what a Python release may change
# (futures, cancellation, lifecycle, typing, the speed-up's build); CI runs them on every
# Python it tests, the whole suite on one (.ci/run).
FAST = {
    "test_accumulator.py", "test_aiokafka_habits.py", "test_backoff.py", "test_blocking.py",
    "test_buffer_memory.py", "test_cancel_scopes.py", "test_config.py", "test_connection.py",
    "test_embedded_broker.py", "test_errors.py", "test_framing.py", "test_future_parity.py",
    "test_futures.py",
    "test_hooks.py", "test_idempotence.py", "test_leaders.py", "test_lifecycle.py",
    "test_lifecycle_table.py", "test_metrics.py", "test_observability.py",
    "test_partitioning.py", "test_protocol.py", "test_sasl.py", "test_security.py",
    "test_sequencing.py", "test_serializers.py", "test_speedups.py", "test_tasks.py",
    "test_thread_future.py", "test_typing.py", "test_visibility.py",
}


# -- running in parallel (pytest-xdist, --dist loadgroup) ------------------------------------

# Tests that start something heavy share one worker per kind, so a run holds one Spark
# session's JVM and one real Kafka cluster at a time, not one per worker: the tests of the
# Spark session, and the real-Kafka tier (tests/real_kafka: a JVM per node). The packaging
# tests build from the checkout (its egg-info): two workers at once broke a build. (A Spark
# job run as a script is a process tree of its own: those run beside each other.)
_GROUP_BY_FIXTURE = {"spark": "spark"}
_GROUP_BY_TEST = {"test_packaging.py::": "packaging",
                  # (its page starts three Apache Kafka nodes: one cluster at a time)
                  "test_doc_python_blocks[docs/guides/kafka.md]": "kafka"}
_REAL_KAFKA = Path(__file__).parent / "real_kafka"
# The tests of a minute or more on two busy cores, started first: xdist hands out the groups
# (the largest first), then the other tests in collection order, and one of these started
# late would be what the run waits for at its end.
_LONG = ("test_spark_cluster.py::", "test_examples.py::test_spark_streaming_example",
         "test_spark.py::test_stream_is_exactly_once_across_a_killed_driver",
         "test_buffer_memory.py::test_ten_thousand_partitions_with_default_settings",
         "test_faults.py::test_soak_random_faults_reconcile",
         "test_typing.py::test_package_and_user_code_type_check", "test_docs.py::")


def _group(item: pytest.Item) -> str | None:
    if _REAL_KAFKA in item.path.parents:
        return "kafka"
    names = getattr(item, "fixturenames", ())
    return next((g for f, g in _GROUP_BY_FIXTURE.items() if f in names),
                next((g for t, g in _GROUP_BY_TEST.items() if t in item.nodeid), None))


_GROUP = pytest.StashKey[str]()
# The budget of a test of the Spark session (pyproject's 120 s otherwise): the first of a
# worker's pays the session's start and its first job's Python workers (61 s of 120 at load
# 10, the test's own write 22 s of it; over 120 s at load 17), and a timeout inside a py4j
# call leaves the gateway out of step (later Spark tests of the worker then fail at once,
# naming it: pytest_runtest_setup).
_SPARK_TIMEOUT_S = 300


@pytest.hookimpl(wrapper=True)  # around xdist's, which puts each group in its node ids
def pytest_collection_modifyitems(config, items):
    """The fast tier's marker, each heavy test's xdist group, and the long tests first.

    Then refuse to run without the groups: pytest-xdist 3.8's loadgroup writes the group
    into a node id field that pytest 9.2 no longer reads (pytest-xdist#1386), and every
    worker started a Spark session of its own and the packaging tests built at once."""
    for item in items:
        if item.path.name in FAST:
            item.add_marker(pytest.mark.fast)
        group = _group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            item.stash[_GROUP] = group
        if group == "spark" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(_SPARK_TIMEOUT_S))
    items.sort(key=lambda item: not any(long in item.nodeid for long in _LONG))
    yield
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        lost = [item.nodeid for item in items
                if _GROUP in item.stash and not item.nodeid.endswith("@" + item.stash[_GROUP])]
        if lost:
            # (Not a UsageError: xdist shows a worker's internal error, and loses that.)
            raise RuntimeError(
                f"pytest-xdist left {len(lost)} tests that must share a worker out of their "
                f"groups ({lost[0]} the first; pytest-xdist#1386): install the pytest that "
                f"pyproject.toml's test extra names, or run with -n 0")


# -- cancellation under asyncio and anyio --------------------------------------------------

@pytest.fixture(params=[
    pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop", marks=pytest.mark.skipif(
        importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")),
])
def anyio_backend(request):
    """anyio's pytest plugin runs a test that uses this fixture on each of these loops."""
    return request.param


@pytest.fixture(params=WAYS)
def cut(request, anyio_backend):
    """`async with cut(seconds):` cuts the block short in one of the WAYS, on each loop."""
    return functools.partial(cut_short, request.param)


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Leave the tests that use anyio_backend to anyio's plugin: pytest-asyncio's auto mode
    takes every coroutine test and would run them in its own loop (never uvloop)."""
    items = yield
    if not isinstance(items, list):
        return items
    return [pytest.Function.from_parent(
                item.parent, name=item.name, callspec=getattr(item, "callspec", None),
                callobj=item.obj, fixtureinfo=item._fixtureinfo, keywords=item.keywords,
                originalname=item.originalname)
            if isinstance(item, PytestAsyncioFunction) and "anyio_backend" in item.fixturenames
            else item for item in items]
