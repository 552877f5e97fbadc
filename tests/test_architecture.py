"""The rooms' import rules of docs/architecture.md, checked on every module's imports.

Only imports at module level or inside functions count alike: a lazy import is still a
dependency of the room.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {"gnnweave": "gnnweave", "golden": "gnnweave.golden", "hw": "gnnweave.hw",
         "sim": "gnnweave.sim", "host": "gnnweave.host"}
# what each room's modules may import of the project (the core is gnnweave.* outside rooms)
ALLOWED = {
    "gnnweave": {"core"},
    "golden": {"core", "golden"},
    "hw": {"core", "hw"},
    "sim": {"core", "golden", "hw", "sim"},
    "host": {"core", "golden", "sim", "host"},
}
# The command line and the Python API are the front doors: they reach every room.
FRONT_DOORS = {"gnnweave/cli.py", "gnnweave/__main__.py", "gnnweave/api.py"}
# Where a rule is broken today, by file and imported room; each entry is a debt to pay off.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def room_of(module: str) -> str | None:
    if module == "gnnweave" or not module.startswith("gnnweave."):
        return "core" if module == "gnnweave" else None
    head = module.split(".")[1]
    return {"golden": "golden", "hw": "hw", "sim": "sim", "host": "host"}.get(head, "core")


def imported_modules(path: Path, package: str):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module


def violations():
    found = []
    for folder, package in ROOMS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in FRONT_DOORS:
                continue
            for lineno, module in imported_modules(path, package):
                room = room_of(module)
                if room is None or room in ALLOWED[folder]:
                    continue
                if (rel, room) not in KNOWN_EXCEPTIONS:
                    found.append(f"{rel}:{lineno} imports {module} ({folder} may not import {room})")
    return found


def test_rooms_import_only_what_the_architecture_allows():
    assert violations() == []


def test_known_exceptions_still_exist():
    """An exception that has been paid off must leave the list, so the rule tightens."""
    for rel, room in KNOWN_EXCEPTIONS:
        folder = rel.split("/")[0]
        mods = [m for _, m in imported_modules(ROOT / rel, ROOMS[folder])]
        assert any(room_of(m) == room for m in mods), f"{rel} no longer imports {room}: drop it"


@pytest.mark.parametrize("module,room", [("gnnweave.fixed", "core"), ("gnnweave", "core"),
                                         ("gnnweave.hw.mac", "hw"), ("numpy", None),
                                         ("gnnweave.host.driver", "host")])
def test_room_of(module, room):
    assert room_of(module) == room


def test_every_package_folder_is_installed():
    """A wheel holds only the packages pyproject.toml lists: each folder with an
    ``__init__.py`` must be one of them (under its room's ``gnnweave.`` name)."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    folders = {".".join(("gnnweave",) + p.parent.relative_to(ROOT).parts).replace(
                   "gnnweave.gnnweave", "gnnweave")
               for room in ("gnnweave", "golden", "hw", "sim", "host")
               for p in (ROOT / room).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert folders - listed == set()
