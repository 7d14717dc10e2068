"""docs/architecture.md's layers, held to the code: each module imports at run time (its
top level and its functions; not what only the type checker reads) only from its own layer
and those below, but for the exceptions the page names; nothing under protocol/ imports
asyncio; testing/ never reads protocol's message schemas."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "aioproducer"

# Bottom up, as the page's table: a module belongs to the first entry its name starts with.
LAYERS = [
    ("errors", ["errors", "_version"]),
    ("speed-ups", ["_speedups"]),
    ("protocol", ["protocol"]),
    ("serializers", ["serializers"]),
    ("hooks", ["hooks"]),
    ("config", ["config"]),
    ("client", ["client"]),
    ("producing", ["_internal"]),
    ("public API", ["producer", "__init__"]),
    ("sync code", ["blocking"]),
    ("tools", ["tools"]),
    ("around it", ["observability", "schema_registry", "integrations", "cli", "__main__",
                   "testing"]),
]
# Imports of a layer above, each named on the page: the speed-ups' pure-Python twin reads
# protocol's two leaf modules; the package loads BlockingProducer on first use.
ALLOWED_UPWARD = {("_speedups._py", "protocol.primitives"),
                  ("_speedups._py", "protocol.batch_layout"), ("__init__", "blocking")}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"aioproducer.{module} is in no layer of docs/architecture.md")


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(path: Path) -> set[str]:
    """What the module imports at run time: its own package's modules (without the
    'aioproducer.'), and other top-level packages (as 'asyncio', 'anyio', ...) with a '!'."""
    module = _name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = "" if package == "__init__" else package
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    top, _, inner = alias.name.partition(".")
                    found.add(("!" + top) if top != "aioproducer" else inner or "__init__")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".") if package else []
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                elif child.module and child.module.startswith("aioproducer"):
                    target = child.module[len("aioproducer."):]
                else:
                    found.add("!" + (child.module or "").partition(".")[0])
                    continue
                for alias in child.names:  # a module imported from its package, or a name
                    inner = f"{target}.{alias.name}" if target else alias.name
                    is_module = (PACKAGE / inner.replace(".", "/")).is_dir() or \
                        (PACKAGE / (inner.replace(".", "/") + ".py")).exists()
                    found.add(inner if is_module else target or "__init__")
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _modules() -> dict[str, set[str]]:
    return {_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_each_module_imports_only_its_layer_and_those_below():
    wrong = []
    for module, imported in _modules().items():
        for target in sorted(i for i in imported if not i.startswith("!")):
            if _layer(target) > _layer(module) and (module, target) not in ALLOWED_UPWARD:
                wrong.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} "
                             f"({LAYERS[_layer(target)][0]})")
    assert not wrong, "imports the layers of docs/architecture.md do not allow:\n" + \
        "\n".join(wrong)


def test_the_protocol_layer_has_no_asyncio_and_testing_no_message_schemas():
    modules = _modules()
    assert [m for m, imported in modules.items()
            if m.startswith("protocol") and "!asyncio" in imported] == []
    assert [m for m, imported in modules.items()
            if m.startswith("testing") and "protocol.messages" in imported] == []
