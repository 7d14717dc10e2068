"""ApacheKafka: real Apache Kafka nodes (KRaft, each a combined broker and controller) on
127.0.0.1, for tests that must hold against the broker users run, not a stand-in.

The jars come from Maven Central through `mvn` (the pom ships beside this module) into a
per-version cache under the user's cache directory, or from an unpacked Kafka distribution
(`kafka_home=`). Needs Java 17+ on PATH (and Maven unless `kafka_home` is given).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from ._watchdog import Watchdog

DEFAULT_VERSION = "4.4.0"
VERSION_ENV = "AIOPRODUCER_KAFKA_VERSION"
# Every user a SASL listener knows (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512), unless given.
DEFAULT_USERS = {"alice": "alice-secret"}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_READY_TOPIC = "__aioproducer_ready"

T = TypeVar("T")


def _cluster_id() -> str:
    """16 random bytes in URL-safe base64, as Kafka's Uuid.randomUuid makes one: never starting
    with "-", which the storage tool's argument parser takes for an option (1 start in 64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class ApacheKafkaError(RuntimeError):
    """Apache Kafka could not be started, or could not do what was asked."""


class ApacheKafkaUnavailable(ApacheKafkaError):
    """What Apache Kafka needs on this machine is missing (Java, or Maven to fetch the jars)."""


# -- jars --------------------------------------------------------------------------------------

def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aioproducer"


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ApacheKafkaUnavailable(
            "Apache Kafka needs Java 17 or newer on PATH: install a JDK or JRE "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")
    return java


def resolve_jars(version: str | None = None) -> Path:
    """The directory of Kafka `version`'s runtime jars, resolved by Maven once per version
    into the cache (a lock file keeps parallel processes from resolving twice)."""
    version = version or os.environ.get(VERSION_ENV) or DEFAULT_VERSION
    if not re.fullmatch(r"[0-9][0-9A-Za-z.\-]*", version):
        raise ApacheKafkaError(f"not a Kafka version: {version!r}")
    root = _cache_root()
    home = root / f"kafka-{version}"
    libs = home / "libs"
    if (libs / f"kafka_2.13-{version}.jar").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ApacheKafkaUnavailable(
            "fetching Apache Kafka's jars needs Maven (mvn) on PATH: install it (Debian/Ubuntu: "
            "apt-get install maven), or pass kafka_home= an unpacked Kafka distribution")
    import fcntl  # (POSIX only, as the nodes' process groups are: imported where needed)

    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"kafka-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (libs / f"kafka_2.13-{version}.jar").exists():
            return libs  # another process resolved it while we waited
        work = Path(tempfile.mkdtemp(prefix=f"kafka-{version}.", dir=root))
        try:
            pom = work / "pom.xml"
            pom.write_bytes(resources.files(__package__).joinpath("kafka-pom.xml").read_bytes())
            result = subprocess.run(
                [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                 "-DincludeScope=runtime", f"-DoutputDirectory={work / 'libs'}",
                 f"-Dkafka.version={version}"],
                capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
            if result.returncode or not (work / "libs" / f"kafka_2.13-{version}.jar").exists():
                raise ApacheKafkaError(
                    f"Maven could not resolve Apache Kafka {version} (is it released, and is "
                    f"Maven Central reachable?):\n{(result.stdout + result.stderr)[-3000:]}")
            shutil.rmtree(home, ignore_errors=True)
            work.rename(home)  # whole or not at all: a half-copied cache is never used
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def _kafka_version(libs: Path) -> str:
    for jar in libs.glob("kafka_2.1*-*.jar"):
        match = re.fullmatch(r"kafka_2\.1\d-(.+?)\.jar", jar.name)
        if match and not match.group(1).endswith(("sources", "javadoc", "test")):
            return match.group(1)
    raise ApacheKafkaError(f"no Kafka broker jar (kafka_2.13-*.jar) in {libs}")


# -- processes ---------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports: the sockets are held until all are bound, since a port
    asked for and let go at once can be handed out again (a node's CONTROLLER and PLAINTEXT
    listeners once got the same port, and the node would not start)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _run_in_thread(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a loop of its own: callable from sync code and from inside a loop."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(make())  # type: ignore[arg-type]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="ApacheKafka-client", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""
# Kafka 3.x logs through log4j 1 (reload4j) when it finds it before the log4j 2 binding.
_LOG4J1 = """\
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
"""


@dataclass
class _Node:
    node_id: int
    ports: dict[str, int]  # listener name -> port
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    changes: dict[str, Any] = field(default_factory=dict)  # start_node(config=...)'s


class ApacheKafka:
    """`nodes` (1 or 3, say) Apache Kafka nodes in KRaft mode on 127.0.0.1, as a sync or async
    context manager. Node ids are 0..nodes-1; `stop_node(i)` and friends take them.

    Listeners: PLAINTEXT always (`bootstrap`), and with `sasl=True` a SASL_PLAINTEXT one
    offering PLAIN and SCRAM-SHA-256/512 for `users` and OAUTHBEARER (Kafka's unsecured JWS
    validator: any unsigned token with a subject), with `tls=True` an SSL one (certificates
    made here; `ssl_client_auth` "required" by default). `bootstrap_for(listener)` gives each
    listener's address list; `reauth_ms` sets `connections.max.reauth.ms` (KIP-368).
    `broker_config` adds or overrides broker properties; `classpath` adds jars or class
    directories to the nodes' (and tools') class path: a plugin of your own, such as a
    `metric.reporters` class (tests/real_kafka/test_telemetry.py's telemetry receiver).
    Commands block (seconds, for those that run Kafka's tools or wait for a node): from a
    loop whose producer must keep running, call them with asyncio.to_thread.
    """

    def __init__(self, nodes: int = 1, *, version: str | None = None,
                 kafka_home: str | os.PathLike[str] | None = None, sasl: bool = False,
                 tls: bool = False, users: Mapping[str, str] | None = None,
                 ssl_client_auth: str = "required", reauth_ms: int | None = None,
                 transaction_version: int | None = None,
                 broker_config: Mapping[str, Any] | None = None,
                 classpath: Sequence[str | os.PathLike[str]] = (), heap_mb: int = 320,
                 start_timeout: float = 120.0, keep_logs: bool | None = None) -> None:
        if not 1 <= nodes <= 9:
            raise ApacheKafkaError(f"nodes must be between 1 and 9, not {nodes}")
        if ssl_client_auth not in ("required", "requested", "none"):
            raise ApacheKafkaError(f"ssl_client_auth is 'required', 'requested' or 'none', "
                                   f"not {ssl_client_auth!r}")
        self.java = _java()
        if kafka_home is not None:
            if version is not None:
                raise ApacheKafkaError("give version= or kafka_home=, not both")
            self.libs = Path(kafka_home) / "libs"
            if not self.libs.is_dir():
                raise ApacheKafkaError(f"kafka_home={str(kafka_home)!r} has no libs/ directory: "
                                       "point it at an unpacked Kafka distribution")
        else:
            self.libs = resolve_jars(version)
        self.version = _kafka_version(self.libs)
        self.nodes = nodes
        self.users = dict(DEFAULT_USERS if users is None else users)
        self.sasl = sasl
        self.tls = tls
        self._ssl_client_auth = ssl_client_auth
        self._reauth_ms = reauth_ms
        self._transaction_version = transaction_version
        self._broker_config = dict(broker_config or {})
        self._classpath = [str(Path(entry).resolve()) for entry in classpath]
        self._heap_mb = heap_mb
        self._start_timeout = start_timeout
        self._keep_logs = (os.environ.get("AIOPRODUCER_KAFKA_KEEP_LOGS") == "1"
                           if keep_logs is None else keep_logs)
        self.cluster_id = _cluster_id()
        self.directory: Path | None = None
        self._nodes: list[_Node] = []
        self._watchdog: Watchdog | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.RLock()
        self._classes: dict[str, str] = {}
        self._quotas: dict[str, set[str]] = {}  # client id -> quota names set
        self.ssl_cafile: str | None = None
        self.ssl_certfile: str | None = None  # a client certificate the SSL listener accepts
        self.ssl_keyfile: str | None = None

    # -- addresses -----------------------------------------------------------------------------

    @property
    def listeners(self) -> list[str]:
        return (["PLAINTEXT"] + (["SASL_PLAINTEXT"] if self.sasl else [])
                + (["SSL"] if self.tls else []))

    def bootstrap_for(self, listener: str = "PLAINTEXT", nodes: Sequence[int] | None = None) -> str:
        """The addresses of `listener` (PLAINTEXT, SASL_PLAINTEXT or SSL, as configured) on
        every node, or on `nodes`, comma-separated."""
        if listener not in self.listeners:
            raise ApacheKafkaError(f"no {listener} listener: this cluster has "
                                   f"{', '.join(self.listeners)}")
        chosen = range(self.nodes) if nodes is None else nodes
        return ",".join(f"127.0.0.1:{self._nodes[i].ports[listener]}" for i in chosen)

    @property
    def bootstrap(self) -> str:
        """Every node's PLAINTEXT address, comma-separated."""
        return self.bootstrap_for("PLAINTEXT")

    @property
    def bootstrap_servers(self) -> str:
        """The same as `bootstrap` (the setting's name)."""
        return self.bootstrap

    def __repr__(self) -> str:
        state = "running" if self._nodes and self._finalizer is not None else "stopped"
        return f"<ApacheKafka {self.version} nodes={self.nodes} {state}>"

    def pid(self, node_id: int) -> int | None:
        """The node's process id while it runs, else None."""
        process = self._node(node_id).process
        return process.pid if process is not None and process.poll() is None else None

    def running(self, node_id: int) -> bool:
        """Whether the node's process is alive (a paused node is)."""
        return self.pid(node_id) is not None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "ApacheKafka":
        """Format the nodes' storage in a temporary directory, launch them and wait until
        every node takes writes (`start_timeout`). Does nothing if started. (Without Java or
        the jars, the constructor raised ApacheKafkaUnavailable.)"""
        if self._finalizer is not None:
            return self
        self.directory = Path(tempfile.mkdtemp(prefix="aioproducer-kafka-"))
        self._watchdog = Watchdog(None if self._keep_logs else self.directory)
        self._finalizer = weakref.finalize(self, _teardown, self._nodes, self._watchdog,
                                           self.directory, self._keep_logs)
        try:
            self._configure()
            self._format()
            for node in self._nodes:
                self._launch(node)
            self._wait_ready(self._start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node and remove the directory (its logs kept with `keep_logs`); also
        run when the object is collected or at exit."""
        if self._finalizer is not None:
            self._finalizer()  # runs _teardown once, whoever calls first
        self._finalizer = None

    def __enter__(self) -> "ApacheKafka":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "ApacheKafka":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # -- configuration -------------------------------------------------------------------------

    def _configure(self) -> None:
        assert self.directory is not None
        (self.directory / "log4j2.properties").write_text(_LOG4J2)
        (self.directory / "log4j.properties").write_text(_LOG4J1)
        if self.tls:
            self._make_certificates()
        names = ["CONTROLLER", *self.listeners]
        free = iter(_free_ports(self.nodes * len(names)))
        for node_id in range(self.nodes):
            ports = {name: next(free) for name in names}
            self._nodes.append(_Node(node_id, ports, self.directory / f"node-{node_id}.properties",
                                     self.directory / f"node-{node_id}.log"))
        for node in self._nodes:
            self._write_config(node)

    def _write_config(self, node: _Node) -> None:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.ports['CONTROLLER']}" for n in self._nodes)
        properties = {**self._properties(node, voters), **node.changes}
        node.config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))

    def _properties(self, node: _Node, voters: str) -> dict[str, Any]:
        assert self.directory is not None
        n = self.nodes
        names = ["CONTROLLER", *self.listeners]
        props: dict[str, Any] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listeners": ",".join(f"{name}://127.0.0.1:{node.ports[name]}" for name in names),
            "advertised.listeners": ",".join(f"{name}://127.0.0.1:{node.ports[name]}"
                                             for name in self.listeners),
            "listener.security.protocol.map": ",".join(
                f"{name}:{'PLAINTEXT' if name == 'CONTROLLER' else name}" for name in names),
            "log.dirs": self.directory / f"data-{node.node_id}",
            # One node cannot hold three replicas of the internal topics.
            "offsets.topic.replication.factor": min(n, 3),
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.replication.factor": min(n, 3),
            "transaction.state.log.min.isr": min(n, 2),
            "transaction.state.log.num.partitions": 5,
            "share.coordinator.state.topic.replication.factor": min(n, 3),
            "share.coordinator.state.topic.min.isr": min(n, 2),
            "group.initial.rebalance.delay.ms": 0,
            # The cleaner's 128 MiB dedupe buffer is most of what makes a default broker heavy.
            "log.cleaner.dedupe.buffer.size": 2 * 1024 * 1024,
            "log.cleaner.threads": 1,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "auto.create.topics.enable": "false",
            # Quotas measured over 1-2 s, not 10-11: a test's few hundred KB are throttled.
            "quota.window.num": 2,
            "quota.window.size.seconds": 1,
        }
        if self.sasl:
            props.update(self._sasl_properties())
        if self.tls:
            props.update({
                "listener.name.ssl.ssl.keystore.type": "PEM",
                "listener.name.ssl.ssl.keystore.location": self.directory / "broker.pem",
                "listener.name.ssl.ssl.truststore.type": "PEM",
                "listener.name.ssl.ssl.truststore.location": self.directory / "ca.pem",
                "listener.name.ssl.ssl.client.auth": self._ssl_client_auth,
                "listener.name.ssl.ssl.endpoint.identification.algorithm": "",
            })
        if self._reauth_ms is not None:
            props["connections.max.reauth.ms"] = self._reauth_ms
        props.update(self._broker_config)
        return props

    def _sasl_properties(self) -> dict[str, str]:
        prefix = "listener.name.sasl_plaintext."
        plain_users = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        scram = 'org.apache.kafka.common.security.scram.ScramLoginModule required;'
        return {
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            f"{prefix}plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
            f"{prefix}scram-sha-256.sasl.jaas.config": scram,
            f"{prefix}scram-sha-512.sasl.jaas.config": scram,
            f"{prefix}oauthbearer.sasl.jaas.config":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                'unsecuredLoginStringClaim_sub="broker";',
        }

    def _make_certificates(self) -> None:
        """A throwaway CA, a broker certificate for 127.0.0.1 and a client certificate."""
        assert self.directory is not None
        try:
            import trustme
            from cryptography.hazmat.primitives import serialization
        except ImportError:
            raise ApacheKafkaUnavailable("the TLS listener's certificates need trustme: "
                                         "pip install 'aioproducer[testing]'") from None

        def pkcs8(key_pem: bytes) -> bytes:  # the only unencrypted form Kafka's PEM store reads
            key = serialization.load_pem_private_key(key_pem, password=None)
            return key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        ca = trustme.CA()
        broker = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client@aioproducer.test")
        (self.directory / "ca.pem").write_bytes(ca.cert_pem.bytes())
        (self.directory / "broker.pem").write_bytes(
            pkcs8(broker.private_key_pem.bytes())
            + b"".join(blob.bytes() for blob in broker.cert_chain_pems))
        (self.directory / "client-cert.pem").write_bytes(
            b"".join(blob.bytes() for blob in client.cert_chain_pems))
        (self.directory / "client-key.pem").write_bytes(pkcs8(client.private_key_pem.bytes()))
        self.ssl_cafile = str(self.directory / "ca.pem")
        self.ssl_certfile = str(self.directory / "client-cert.pem")
        self.ssl_keyfile = str(self.directory / "client-key.pem")

    # -- java ----------------------------------------------------------------------------------

    def _java_command(self, main: str, *args: str, heap_mb: int = 128) -> list[str]:
        assert self.directory is not None
        # A tool runs for seconds: the quick compiler alone starts it sooner.
        tiered = [] if main == "kafka.Kafka" else ["-XX:TieredStopAtLevel=1"]
        return [self.java, "-Xms32m", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", *tiered,
                "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
                f"-Dlog4j.configuration=file:{self.directory / 'log4j.properties'}",
                "-cp", os.pathsep.join([f"{self.libs}/*", *self._classpath]), main, *args]

    def _run_tool(self, main: str, *args: str, timeout: float = 120.0) -> str:
        """Run one of Kafka's command-line tools to the end, watched like the nodes."""
        assert self._watchdog is not None
        process = subprocess.Popen(self._java_command(main, *args), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        self._watchdog.watch(process.pid)
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            raise ApacheKafkaError(f"{main.rsplit('.', 1)[-1]} {' '.join(args)} did not finish "
                                   f"within {timeout} s:\n{out.decode(errors='replace')[-3000:]}")
        finally:
            self._watchdog.forget(process.pid)
        text = out.decode(errors="replace")
        if process.returncode:
            raise ApacheKafkaError(f"{main.rsplit('.', 1)[-1]} {' '.join(args)} failed "
                                   f"(exit {process.returncode}):\n{text[-3000:]}")
        return text

    def _tool_class(self, *candidates: str) -> str:
        """The first of `candidates` the jars hold (tools moved from core to kafka-tools)."""
        key = candidates[0]
        if key not in self._classes:
            entries: set[str] = set()
            for jar in self.libs.glob("kafka*.jar"):
                with zipfile.ZipFile(jar) as archive:
                    entries.update(archive.namelist())
            found = [c for c in candidates if c.replace(".", "/") + ".class" in entries]
            if not found:
                raise ApacheKafkaError(f"none of {', '.join(candidates)} in {self.libs} "
                                       "(kafka-tools missing?)")
            self._classes[key] = found[0]
        return self._classes[key]

    def _format(self) -> None:
        args: list[str] = []
        if self.sasl:
            for name, password in self.users.items():
                for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        if self._transaction_version is not None:
            args += ["--feature", f"transaction.version={self._transaction_version}"]
        errors: list[BaseException] = []

        def format_node(node: _Node) -> None:
            try:
                self._run_tool("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                               "-c", str(node.config), *args)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=format_node, args=(node,)) for node in self._nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _launch(self, node: _Node) -> None:
        assert self._watchdog is not None
        with open(node.log, "ab") as log:
            node.process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(node.config), heap_mb=self._heap_mb),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        node.paused = False
        self._watchdog.watch(node.process.pid)

    # -- readiness -----------------------------------------------------------------------------

    def _wait_ready(self, timeout: float, nodes: Sequence[int] | None = None) -> None:
        """Until every node (or `nodes`) is registered and unfenced, and a topic replicated on
        all of them takes a record with acks=all."""
        deadline = time.monotonic() + timeout
        wanted = list(range(self.nodes)) if nodes is None else list(nodes)
        for node_id in wanted:
            self._wait_listening(self._nodes[node_id], deadline)
        last: BaseException | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                _run_in_thread(lambda: self._probe(wanted, deadline))
                return
            except (OSError, ApacheKafkaError, asyncio.TimeoutError) as exc:
                last = exc
            except Exception as exc:  # a KafkaError from the producer while nodes settle
                last = exc
            time.sleep(0.2)
        raise ApacheKafkaError(f"Kafka nodes {wanted} not ready within {timeout} s "
                               f"(last: {last!r}):\n{self.log_tail()}")

    def _wait_listening(self, node: _Node, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                socket.create_connection(("127.0.0.1", node.ports["PLAINTEXT"]), 0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise ApacheKafkaError(f"Kafka node {node.node_id} did not listen within the start "
                               f"timeout:\n{self.log_tail(node.node_id)}")

    def _check_alive(self) -> None:
        for node in self._nodes:
            if node.process is not None and node.process.poll() is not None:
                raise ApacheKafkaError(
                    f"Kafka node {node.node_id} exited (code {node.process.returncode}):\n"
                    f"{self.log_tail(node.node_id)}")

    async def _probe(self, wanted: list[int], deadline: float) -> None:
        from ..client.cluster import Cluster
        from ..client.tasks import TaskSet
        from ..config import ProducerConfig
        from ..errors import TopicAlreadyExistsError
        from ..producer import Producer
        from ..tools.admin import create_topic

        config = ProducerConfig.from_kwargs(bootstrap_servers=self.bootstrap,
                                            allow_auto_create_topics=False)
        tasks = TaskSet()
        cluster = Cluster(config, tasks)
        try:
            await asyncio.wait_for(cluster.refresh(), 5)
            missing = set(wanted) - set(cluster.brokers)
        finally:
            cluster.close()
            await tasks.aclose()
        if missing:
            raise ApacheKafkaError(f"nodes {sorted(missing)} not registered yet")
        try:
            await create_topic(config, _READY_TOPIC, self.nodes, replication_factor=self.nodes,
                               configs={"min.insync.replicas": str(self.nodes)})
        except TopicAlreadyExistsError:
            pass
        remaining = max(1.0, min(30.0, deadline - time.monotonic()))
        async with Producer(self.bootstrap, acks="all",
                            delivery_timeout_ms=int(remaining * 1000),
                            request_timeout_ms=int(min(remaining, 10) * 1000)) as producer:
            for partition in range(self.nodes):  # one leader per node, spread by the controller
                await asyncio.wait_for(producer.send(_READY_TOPIC, b"ready", partition=partition),
                                       remaining)

    # -- nodes ---------------------------------------------------------------------------------

    def _node(self, node_id: int) -> _Node:
        if not self._nodes:
            raise ApacheKafkaError("the cluster is not started")
        if not 0 <= node_id < len(self._nodes):
            raise ApacheKafkaError(f"no node {node_id}: node ids are 0..{len(self._nodes) - 1}")
        return self._nodes[node_id]

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        """SIGTERM: a controlled shutdown (leadership moves away first); SIGKILL after
        `timeout` seconds."""
        with self._lock:
            node = self._node(node_id)
            if node.process is None:
                return
            if node.paused:
                os.killpg(node.process.pid, signal.SIGCONT)
            node.process.terminate()
            try:
                node.process.wait(timeout)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(10)
            self._reap(node)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: the node dies mid-flight, as in a power cut (its log is recovered on start)."""
        with self._lock:
            node = self._node(node_id)
            if node.process is None:
                return
            node.process.kill()
            node.process.wait(10)
            self._reap(node)

    def _reap(self, node: _Node) -> None:
        assert node.process is not None and self._watchdog is not None
        self._watchdog.forget(node.process.pid)
        node.process = None
        node.paused = False

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP: the node stops answering, but its connections stay open."""
        with self._lock:
            node = self._node(node_id)
            if node.process is None:
                raise ApacheKafkaError(f"node {node_id} is not running")
            os.killpg(node.process.pid, signal.SIGSTOP)
            node.paused = True

    def resume_node(self, node_id: int) -> None:
        """SIGCONT: a paused node answers again."""
        with self._lock:
            node = self._node(node_id)
            if node.process is None:
                raise ApacheKafkaError(f"node {node_id} is not running")
            os.killpg(node.process.pid, signal.SIGCONT)
            node.paused = False

    def start_node(self, node_id: int, wait: bool = True, timeout: float = 120.0,
                   config: Mapping[str, Any] | None = None) -> None:
        """Start a stopped or killed node again, on its ports and data; with `wait`, until it
        is registered again and every node takes writes. `config`: broker properties changed
        for this node from now on (`advertised.listeners`: a broker that comes back at
        another address)."""
        with self._lock:
            node = self._node(node_id)
            if node.process is not None:
                if config:
                    raise ApacheKafkaError(f"node {node_id} is running: stop it before "
                                           "changing its config")
                return
            if config:
                node.changes.update(config)
                self._write_config(node)
            self._launch(node)
        if wait:
            self._wait_ready(timeout, [node_id])

    # -- administration ------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: Mapping[str, Any] | None = None) -> None:
        """Create a topic (CreateTopics to the controller), with topic `config` properties."""
        from ..config import ProducerConfig
        from ..tools.admin import create_topic

        settings = ProducerConfig.from_kwargs(bootstrap_servers=self.bootstrap)
        _run_in_thread(lambda: create_topic(
            settings, name, partitions, replication_factor=replication_factor,
            configs={k: str(v) for k, v in (config or {}).items()}))

    def elect_leaders(self, topic: str | None = None, partition: int | None = None,
                      election_type: str = "PREFERRED") -> str:
        """Kafka's leader election command for every partition (or one topic's, or one
        partition): each preferred replica leads again; `election_type="UNCLEAN"` for an
        unclean election. Returns the command's report."""
        assert self.directory is not None
        if topic is None:
            where = ["--all-topic-partitions"]
        else:
            chosen = [partition] if partition is not None else range(self._partitions(topic))
            spec = self.directory / f"elect-{time.monotonic_ns()}.json"
            spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": p}
                                                       for p in chosen]}))
            where = ["--path-to-json-file", str(spec)]
        return self._run_tool(self._tool_class("org.apache.kafka.tools.LeaderElectionCommand"),
                              "--bootstrap-server", self.bootstrap,
                              "--election-type", election_type.upper(), *where)

    def _partitions(self, topic: str) -> int:
        from ..client.cluster import Cluster
        from ..client.tasks import TaskSet
        from ..config import ProducerConfig

        async def count() -> int:
            tasks = TaskSet()
            cluster = Cluster(ProducerConfig.from_kwargs(bootstrap_servers=self.bootstrap,
                                                         allow_auto_create_topics=False), tasks)
            try:
                return len((await cluster.topic(topic, 10)).leaders)
            finally:
                cluster.close()
                await tasks.aclose()
        return _run_in_thread(count)

    def set_quota(self, client_id: str, producer_byte_rate: int | None = None, *,
                  consumer_byte_rate: int | None = None,
                  request_percentage: float | None = None) -> None:
        """A client-id quota (bytes per second, per broker); none given removes the quotas
        set here for `client_id`."""
        values = {"producer_byte_rate": producer_byte_rate,
                  "consumer_byte_rate": consumer_byte_rate,
                  "request_percentage": request_percentage}
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            change = ["--add-config", ",".join(f"{k}={v}" for k, v in given.items())]
            self._quotas.setdefault(client_id, set()).update(given)
        else:
            names = self._quotas.pop(client_id, set())
            if not names:
                return
            change = ["--delete-config", ",".join(sorted(names))]
        self._run_tool(self._tool_class("org.apache.kafka.tools.ConfigCommand",
                                        "kafka.admin.ConfigCommand"),
                       "--bootstrap-server", self.bootstrap, "--alter", *change,
                       "--entity-type", "clients", "--entity-name", client_id)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """DeleteRecords: the partition's log start moves to `before_offset` (-1: the end)."""
        assert self.directory is not None
        spec = self.directory / f"delete-{topic}-{partition}-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": partition, "offset": before_offset}]}))
        self._run_tool(self._tool_class("org.apache.kafka.tools.DeleteRecordsCommand",
                                        "kafka.admin.DeleteRecordsCommand"),
                       "--bootstrap-server", self.bootstrap, "--offset-json-file", str(spec))

    def run_tool(self, main: str, *args: str, timeout: float = 120.0) -> str:
        """Run any class with a main() from Kafka's jars (e.g.
        "org.apache.kafka.tools.TransactionsCommand") and return its output."""
        return self._run_tool(main, *args, timeout=timeout)

    # -- logs ----------------------------------------------------------------------------------

    def log_tail(self, node_id: int | None = None, chars: int = 3000) -> str:
        """The end of each node's log (or one node's): what a failed test should show."""
        chosen = self._nodes if node_id is None else [self._node(node_id)]
        parts = []
        for node in chosen:
            try:
                text = node.log.read_text(errors="replace")[-chars:]
            except OSError:
                text = "(no log)"
            parts.append(f"--- Kafka node {node.node_id} ({node.log}) ---\n{text}")
        return "\n".join(parts)


def _teardown(nodes: list[_Node], watchdog: Watchdog, directory: Path, keep_logs: bool) -> None:
    for node in nodes:
        if node.process is not None and node.process.poll() is None:
            try:
                os.killpg(node.process.pid, signal.SIGKILL)  # data is thrown away: no need to wait
            except OSError:
                pass
    for node in nodes:
        if node.process is not None:
            node.process.wait(10)
            node.process = None
    watchdog.close()  # removes the directory unless logs are kept
    if keep_logs:
        for data in directory.glob("data-*"):
            shutil.rmtree(data, ignore_errors=True)
