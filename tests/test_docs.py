"""The documentation site builds with warnings as errors (broken links and anchors, pages
missing from the nav, docstrings mkdocstrings cannot render), and what it builds is complete
and readable without the internet."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise  # CI installs the docs extra (./dev test): the build must run there
        pytest.skip("install the docs extra to build the site: pip install '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    assert (site / "index.html").exists()
    assert (site / "guides" / "async" / "index.html").exists()


def test_the_api_reference_is_rendered_from_the_docstrings(site):
    page = (site / "api" / "producer" / "index.html").read_text()
    assert 'id="aioproducer.Producer.send"' in page and "once the broker acknowledged" in page
    errors = (site / "api" / "errors" / "index.html").read_text()
    assert 'id="aioproducer.errors.NotLeaderOrFollowerError"' in errors
    for html in site.rglob("*.html"):
        assert not re.search(r"<p>:::", html.read_text()), f"{html}: a directive left as text"


def test_example_files_are_shown_as_they_run(site):
    page = (site / "guides" / "web" / "index.html").read_text()
    assert "producer_lifespan" in page and "setup_producer" in page and "--8&lt;--" not in page


def test_pages_fetch_nothing_from_the_network(site):
    """No web fonts (theme.font: false) or other assets from another host: the site is read
    on machines without the internet."""
    remote = re.compile(r'<(?:link|script)[^>]+(?:href|src)="(https?:)?//', re.I)
    for html in site.rglob("*.html"):
        found = remote.search(html.read_text())
        assert not found, f"{html.relative_to(site)} loads {found.group(0)}"


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (the anchors mkdocs and GitHub give headings alike here)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readmes_links_into_the_docs_arrive():
    """The README is not part of the site (mkdocs checks the pages' links, not its): each
    relative link it has names a file that exists, and a heading there if it has an anchor."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#([^)]+))?\)", readme)
    assert len(links) >= 10, links
    for path, anchor in links:
        target = ROOT / path
        assert target.exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in map(_slug, headings), f"README links to {path}#{anchor}: no heading"
