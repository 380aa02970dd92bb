"""The public API is what ``rabbitretry.__all__`` says, documented; the exception tree is whole."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from pathlib import Path

import rabbitretry
from rabbitretry import errors
from rabbitretry.errors import RabbitRetryError

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"

EXPECTED = [
    "Binding",
    "CallbackKind",
    "CallbackReceiver",
    "ConfigurationError",
    "ConnectionLost",
    "Consumer",
    "Context",
    "Death",
    "Downstream",
    "DownstreamUnavailable",
    "Exchange",
    "Expected",
    "HmacSignature",
    "MissingMessageId",
    "Outbox",
    "OutboxRelay",
    "Permanent",
    "PublishError",
    "PublishRefused",
    "Publisher",
    "RabbitRetryError",
    "Reconciler",
    "Reconciliation",
    "RecordNotFound",
    "Retry",
    "RetryPolicy",
    "ServiceUnavailable",
    "StateMachine",
    "Topology",
    "TopologyError",
    "TransactionRolledBack",
    "UnpublishableError",
    "UnroutableError",
    "WorkQueue",
    "Worker",
    "topology_of",
]
"""Adding or removing a public name is a decision: change this list, docs/api.md and the
CHANGELOG together."""


def test_all_is_the_expected_list() -> None:
    assert rabbitretry.__all__ == EXPECTED


def test_every_public_name_imports_and_has_a_docstring() -> None:
    namespace: dict[str, object] = {}
    exec(f"from rabbitretry import {', '.join(rabbitretry.__all__)}", namespace)
    for name in rabbitretry.__all__:
        value = namespace[name]
        assert value is getattr(rabbitretry, name)
        assert (getattr(value, "__doc__", None) or "").strip(), f"{name} has no docstring"


def test_every_public_name_is_in_the_api_page() -> None:
    page = API_DOC.read_text()
    missing = [
        name
        for name in rabbitretry.__all__
        if f"`{name}`" not in page and not re.search(rf"── {name}\b", page)
    ]
    assert not missing, f"not in docs/api.md: {missing}"


def test_the_version_is_the_installed_one() -> None:
    assert rabbitretry.__version__ == importlib.metadata.version("rabbitretry")


def _all_subclasses(root: type) -> set[type]:
    found: set[type] = set()
    for sub in root.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def _rabbitretry_exceptions() -> set[type]:
    """Every subclass of RabbitRetryError that rabbitretry itself defines (all modules loaded)."""
    for module in pkgutil.walk_packages(rabbitretry.__path__, "rabbitretry."):
        if module.name != "rabbitretry.__main__":
            importlib.import_module(module.name)
    return {
        cls
        for cls in _all_subclasses(RabbitRetryError)
        if cls.__module__.split(".")[0] == "rabbitretry"
    }


_BRANCH = re.compile(r"[├└]── (\w+)")


def parse_tree(text: str) -> dict[str, str | None]:
    """The tree drawn in ``text``: each class name and its parent's (None for the root)."""
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    root_column: int | None = None
    for line in text.splitlines():
        if root_column is None:
            if line.lstrip().startswith("RabbitRetryError "):
                root_column = len(line) - len(line.lstrip())
                parents["RabbitRetryError"] = None
                stack = ["RabbitRetryError"]
            continue
        branch = _BRANCH.search(line)
        if branch is None:
            if not line.strip() or "│" not in line:
                break  # the end of the drawing
            continue  # a description's second line
        depth = (branch.start() - root_column) // 4 + 1
        del stack[depth:]
        parents[branch[1]] = stack[-1]
        stack.append(branch[1])
    return parents


def test_the_exception_tree_lists_every_exception_under_its_base() -> None:
    tree = parse_tree(errors.__doc__ or "")
    defined = _rabbitretry_exceptions() | {RabbitRetryError}
    assert set(tree) == {cls.__name__ for cls in defined}
    for cls in defined - {RabbitRetryError}:
        # The one base within the hierarchy (a class may also derive from a builtin one).
        (base,) = [b for b in cls.__bases__ if issubclass(b, RabbitRetryError)]
        assert tree[cls.__name__] == base.__name__, f"{cls.__name__} is drawn under the wrong base"


def test_the_api_page_draws_the_same_tree() -> None:
    assert parse_tree(API_DOC.read_text()) == parse_tree(errors.__doc__ or "")


ROOT = API_DOC.parents[1]
_FROM_IMPORT = re.compile(r"^\s*from (rabbitretry[\w.]*) import (\([^)]*\)|[^\n#]+)", re.M)


def _documented_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every ``from rabbitretry... import name`` in the docs, the README
    and the examples: what a user is shown to import."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    sources += sorted((ROOT / "examples").glob("*.py"))
    found = []
    for path in sources:
        for module, names in _FROM_IMPORT.findall(path.read_text()):
            for name in names.strip("()").replace("\n", " ").split(","):
                if name.strip():
                    found.append((path.name, module, name.split(" as ")[0].strip()))
    return found


def test_every_name_the_docs_and_examples_import_is_exported() -> None:
    imports = _documented_imports()
    assert len(imports) > 20  # the scan finds them
    unexported = []
    for source, module_name, name in imports:
        module = importlib.import_module(module_name)
        if importlib.util.find_spec(f"{module_name}.{name}") if hasattr(module, "__path__") else 0:
            continue  # a module of a package
        if name not in getattr(module, "__all__", ()):
            unexported.append(f"{source}: from {module_name} import {name}")
    assert not unexported, "imported but not in the module's __all__: " + "; ".join(unexported)
