"""The package's shape holds: layers point one way, modules stay small, one road to the ledger.

The layer contracts themselves live in ``pyproject.toml`` (import-linter; ``make lint`` runs
them). These tests run them on the real tree, show that an upward import breaks them, and check
what import-linter cannot: module sizes, the top level's size, and that only ``ledger/`` runs a
statement that writes the ledger tables.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rabbitretry import db

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rabbitretry"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_LINES = 400
MAX_TOP_LEVEL_MODULES = 15
LEDGER_TABLES = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+rabbitretry\.(?:ledger|attempt)\b", re.I
)


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """The package and its contracts, copied where a test may break them."""
    shutil.copytree(PACKAGE, tmp_path / "rabbitretry", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold_on_the_package() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "statement", "broken"),
    [
        # The ledger reaching up into the delivery pipeline.
        ("ledger/statements.py", "import rabbitretry.delivery.pipeline", "Layers point one way"),
        # The user's vocabulary reaching into the engine.
        ("retry.py", "import rabbitretry.ledger.statements", "Layers point one way"),
        ("consumer.py", "import rabbitretry.delivery.attempt", "vocabulary imports nothing"),
        # A driver used outside its one module.
        ("delivery/attempt.py", "import asyncpg", "the only importer of asyncpg"),
        ("operations/__init__.py", "import aio_pika", "the only importer of aio-pika"),
    ],
    ids=["ledger-to-delivery", "retry-to-ledger", "consumer-to-delivery", "asyncpg", "aio-pika"],
)
def test_an_import_against_the_architecture_breaks_a_contract(
    package_copy: Path, module: str, statement: str, broken: str
) -> None:
    target = package_copy / "rabbitretry" / module
    target.write_text(target.read_text() + f"\n{statement}  # noqa\n")
    result = lint_imports(package_copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(rf"{re.escape(broken)}.* BROKEN", result.stdout), result.stdout


@pytest.mark.parametrize("folder", ["rabbitretry", "drills", "bench"])
def test_no_module_is_over_the_limit(folder: str) -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / folder).rglob("*.py")
    }
    assert sizes, f"no modules under {folder}/"
    over = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"


def test_the_top_level_holds_only_the_vocabulary_and_the_entry_points() -> None:
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def _writers_of_the_ledger() -> set[str]:
    return {name for name, sql in db.queries().items() if LEDGER_TABLES.search(sql)}


def test_only_the_ledger_package_writes_the_ledger_tables() -> None:
    writers = _writers_of_the_ledger()
    assert {"finish_attempt", "schedule_retry", "prune_ledger"} <= writers  # the scan works
    outside: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "ledger":
            continue
        text = path.read_text()
        outside += [f"{relative}: query({name!r})" for name in writers if f'"{name}"' in text]
        outside += [f"{relative}: {m[0]!r}" for m in LEDGER_TABLES.finditer(text)]
    assert not outside, "ledger writes outside rabbitretry/ledger/: " + "; ".join(outside)
