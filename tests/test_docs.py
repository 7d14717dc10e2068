"""The documentation site builds with warnings as errors (broken links and anchors, pages
missing from the nav, docstrings mkdocstrings cannot render), and what it builds is complete
and readable without the internet."""

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import typing
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


def _returned_classes(annotation: object, namespace: dict[str, object],
                      classes: dict[str, type]) -> set[type]:
    """The package's classes named in an annotation (a string, under `from __future__ import
    annotations`, or a ForwardRef or type in a generic's arguments)."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return {annotation} if annotation.__module__.startswith("aioproducer") else set()
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if not isinstance(annotation, str):
        found: set[type] = set()
        for arg in typing.get_args(annotation):
            found |= _returned_classes(arg, namespace, classes)
        return found
    found = set()
    for name in re.findall(r"[A-Za-z_]\w*", annotation):
        named = namespace.get(name, classes.get(name))
        if isinstance(named, type) and named.__module__.startswith("aioproducer"):
            found.add(named)
    return found


def test_every_class_a_public_call_returns_is_exported_and_documented():
    """What a user's code gets back from the public API (a call's or property's return, a
    future's result, a metrics snapshot's fields, recursively) can be imported from
    `aioproducer` (to annotate it) and has its page in the API reference, or is in a public
    module whose page renders it whole. Errors are aioproducer.errors', all rendered on
    their page."""
    import aioproducer
    from aioproducer.blocking import BlockingProducer  # (loaded on first use)

    classes = {cls.__name__: cls for module in list(sys.modules.values())
               if module is not None and module.__name__.startswith("aioproducer")
               for cls in vars(module).values() if isinstance(cls, type)}
    reference = "\n".join(page.read_text() for page in (ROOT / "docs" / "api").glob("*.md"))
    seen: set[type] = set()
    to_check: list[type] = [BlockingProducer]
    roots: list[object] = [getattr(aioproducer, name) for name in aioproducer.__all__]
    for root in roots:
        if isinstance(root, type):
            to_check.append(root)
        elif callable(root):
            to_check += _returned_classes(root.__annotations__.get("return"),
                                          vars(sys.modules[root.__module__]), classes)
    missing = []
    while to_check:
        cls = to_check.pop()
        if cls in seen:
            continue
        seen.add(cls)
        exported = getattr(aioproducer, cls.__name__, None) is cls and \
            re.search(rf"^::: aioproducer\.([\w.]+\.)?{cls.__name__}$", reference, re.M)
        # (or in a public module rendered whole, as ProducerHooks in aioproducer.hooks)
        in_its_module = "._" not in cls.__module__ and \
            re.search(rf"^::: {re.escape(cls.__module__)}$", reference, re.M)
        if not exported and not in_its_module:
            missing.append(cls.__qualname__)
        namespace = vars(sys.modules[cls.__module__])
        annotations: list[object] = [arg for base in getattr(cls, "__orig_bases__", ())
                                     for arg in typing.get_args(base)]
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                member = member.fget
            member = getattr(member, "__func__", member)  # (a classmethod's, a staticmethod's)
            annotations.append(getattr(member, "__annotations__", {}).get("return"))
        if dataclasses.is_dataclass(cls) or hasattr(cls, "_fields"):  # its fields too
            annotations += [a for n, a in cls.__annotations__.items() if not n.startswith("_")]
        for annotation in annotations:
            to_check += _returned_classes(annotation, namespace, classes)
    assert not missing, f"returned by the public API, not exported or not documented: {missing}"


def _every_module() -> None:
    """Import every module of the package but `__main__` (it runs the command line), skipping
    those whose optional dependency (pyspark, fastapi, ...) is not installed."""
    import pkgutil

    import aioproducer

    for module in pkgutil.walk_packages(aioproducer.__path__, "aioproducer."):
        if module.name == "aioproducer.__main__":
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("aioproducer"):
                raise


def test_every_error_is_importable_from_errors_and_on_its_page(site):
    """Every KafkaError the package defines can be imported from `aioproducer.errors` and
    has its entry on the errors page, whatever layer raises it (the framing's errors reached
    users, catchable only as CorruptMessageError, their classes importable only from the
    protocol layer). The Spark data source's own are on the integrations page."""
    from aioproducer.errors import KafkaError
    import aioproducer.errors

    _every_module()
    page = (site / "api" / "errors" / "index.html").read_text()
    integrations = (site / "api" / "integrations" / "index.html").read_text()
    classes, to_walk = set(), [KafkaError]
    while to_walk:
        cls = to_walk.pop()
        if cls not in classes and cls.__module__.startswith("aioproducer."):
            classes.add(cls)
            to_walk += cls.__subclasses__()
    assert len(classes) > 100  # (every Kafka error code is a class)
    missing = []
    for cls in classes:
        if cls.__module__.startswith("aioproducer.integrations."):
            if f'id="{cls.__module__}.{cls.__name__}"' not in integrations:
                missing.append(f"{cls.__module__}.{cls.__name__}")
        elif getattr(aioproducer.errors, cls.__name__, None) is not cls or \
                f'id="aioproducer.errors.{cls.__name__}"' not in page:
            missing.append(f"{cls.__module__}.{cls.__name__}")
    assert not missing, f"errors not importable from aioproducer.errors or not documented: " \
        f"{sorted(missing)}"


def _settings_table() -> list[tuple[list[str], list[str], str]]:
    """docs/settings.md's table: each row's setting names, the defaults given (the first
    backquoted value of each part of the default cell, parts split on " / "), its range."""
    rows = []
    for line in (ROOT / "docs" / "settings.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        setting, default, range_, _ = line.split(" | ", 3)
        names = re.findall(r"`([a-z_]+)`", setting)
        defaults = [found.group(1) for part in default.split(" / ")
                    if (found := re.search(r"`([^`]*)`", part))]
        rows.append((names, defaults, range_))
    return rows


def test_the_settings_page_lists_every_setting_with_its_default_and_lower_bound():
    """Each setting of ProducerConfig has its row on docs/settings.md, with the default the
    code has and, for an integer, the least value the code takes (`≥ N` in its range)."""
    import ast

    from aioproducer.config import _INT_SETTINGS, ProducerConfig, _setting_names

    rows = _settings_table()
    listed = [name for names, _, _ in rows for name in names]
    assert sorted(listed) == sorted(_setting_names()), \
        "settings.md's table and ProducerConfig's settings differ: " \
        f"{sorted(set(listed) ^ _setting_names())}"
    fields = {f.name: f.default for f in dataclasses.fields(ProducerConfig)}
    wrong = []
    for names, defaults, _ in rows:
        if names == ["bootstrap_servers"]:
            continue  # (required: no default)
        assert len(defaults) in (1, len(names)), f"{names}: defaults {defaults}"
        for name, shown in zip(names, defaults * len(names) if len(defaults) == 1 else defaults):
            if ast.literal_eval(shown) != fields[name]:
                wrong.append(f"{name}: the page says {shown}, the code has {fields[name]!r}")
    ranges = {name: range_ for names, _, range_ in rows for name in names}
    for name, low in _INT_SETTINGS:
        if f"≥ {low}" not in ranges[name]:
            wrong.append(f"{name}: the code takes {low} and up, the page's range is "
                         f"{ranges[name]!r}")
    assert not wrong, "\n".join(wrong)


def test_the_errors_page_names_every_error_of_the_package_s_own():
    """docs/errors.md names each exception aioproducer.errors defines for itself (the base
    classes and the errors the client raises; not the one class per broker error code,
    which the API reference lists), so a new one is documented where users look first."""
    from aioproducer import errors

    own = [name for name, cls in vars(errors).items()
           if isinstance(cls, type) and issubclass(cls, BaseException)
           and cls.__module__ == errors.__name__ and not issubclass(cls, errors.BrokerError)]
    assert len(own) > 20, own
    page = (ROOT / "docs" / "errors.md").read_text()
    missing = [name for name in own if not re.search(rf"\b{name}\b", page)]
    assert not missing, f"not named on docs/errors.md: {missing}"


def test_the_architecture_page_names_every_module():
    """docs/architecture.md names each module of the package (as `name.py`, or `name` in
    code), so a new module has a place on the page a maintainer reads first."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = {part for code in re.findall(r"`([\w/.]+)`", page) for part in re.split(r"[/.]", code)}
    named |= set(re.findall(r"(\w+)\.(?:py|c)\b", page))  # (file names in prose and the tree)
    package = ROOT / "aioproducer"
    missing = [str(path.relative_to(package)) for path in sorted(package.rglob("*"))
               if path.suffix in (".py", ".c") and path.stem != "__init__"
               and path.stem not in named]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"


def test_every_exported_name_has_its_entry_in_the_api_reference():
    """Each name of `aioproducer.__all__` and `aioproducer.testing.__all__` has its `:::`
    entry in docs/api (aioproducer.testing's ApacheKafka had none)."""
    import aioproducer
    import aioproducer.testing

    reference = "\n".join(page.read_text() for page in (ROOT / "docs" / "api").glob("*.md"))
    entries = set(re.findall(r"^::: ([\w.]+)$", reference, re.MULTILINE))
    missing = []
    for module in (aioproducer, aioproducer.testing):
        for name in module.__all__:
            if name == "__version__":
                continue
            defined_in = getattr(getattr(module, name), "__module__", "")
            if not {f"{module.__name__}.{name}", f"{defined_in}.{name}", defined_in} & entries:
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"exported, with no entry in docs/api: {missing}"
