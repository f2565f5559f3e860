"""The import rule of the layers (processors/__init__.py), checked on the source.

Every `import` and `from … import` in processors/ and topics/ is read with `ast`,
those inside functions too, and compared with the layers' order: a module imports
only its own layer and the layers below it; the engine only itself, `topics` and
pure data libraries; the tap's sans-IO core likewise, and no clock or socket; and
only the runtime imports the Kafka client and HTTP libraries.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# Lowest first: a module may import project modules of its own rank or below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("topics",),
    ("processors.engine",),
    ("processors.tap",),
    ("processors.config", "processors.metrics", "processors.safe_logging"),
    ("processors.processing",),
    ("processors.view",),
    ("processors.runtime",),
    ("processors.tools",),
)
# Only the runtime may import these: Faust, its service library, the Kafka client,
# the HTTP server and client, and what Faust's app is built on.
RUNTIME_ONLY = frozenset({"faust", "aiokafka", "mode", "rocksdict", "uvloop", "aiohttp"})
# The sans-IO packages, and what besides the standard library they may import.
SANS_IO = ("processors.engine", "processors.tap")
ENGINE_LIBRARIES = frozenset({"orjson", "pydantic"})
# What no sans-IO module may import from the standard library: sockets, event
# loops, clocks.
SANS_IO_FORBIDDEN = frozenset({"asyncio", "socket", "time", "datetime", "selectors", "ssl"})


def _rank(module: str) -> int | None:
    for rank, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return rank
    return None


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(root: Path, name: str) -> bool:
    where = root.joinpath(*name.split("."))
    return where.is_dir() or where.with_suffix(".py").is_file()


def _imports(root: Path, path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file."""
    found: list[tuple[int, str]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from processors.engine import history` imports processors.engine.history
            found += [(node.lineno, f"{base}.{alias.name}"
                       if _is_module(root, f"{base}.{alias.name}") else base)
                      for alias in node.names]
    return found


def layer_violations(root: Path) -> list[str]:
    """Every import under `root`'s processors/ and topics/ that breaks the rule."""
    violations = []
    for path in sorted([*root.glob("processors/**/*.py"), *root.glob("topics/**/*.py")]):
        module = _module_name(root, path)
        # The root package only describes the layers: it may import no layer above topics.
        rank = 0 if module == "processors" else _rank(module)
        where = path.relative_to(root)
        if rank is None:
            violations.append(f"{where}: in no layer (add it to LAYERS)")
            continue
        in_runtime = module.startswith("processors.runtime")
        for line, imported in _imports(root, path, module):
            top = imported.split(".")[0]
            imported_rank = _rank(imported)
            if top in RUNTIME_ONLY and not in_runtime:
                violations.append(f"{where}:{line}: imports {imported}; only processors.runtime"
                                  " may import Faust, aiohttp or the Kafka client")
            elif imported_rank is not None and imported_rank > rank:
                violations.append(f"{where}:{line}: imports {imported}, a higher layer")
            elif (module.startswith(SANS_IO) and imported_rank is None
                  and ((top not in sys.stdlib_module_names and top not in ENGINE_LIBRARIES)
                       or top in SANS_IO_FORBIDDEN)):
                violations.append(f"{where}:{line}: the sans-IO {module} imports {imported}")
            elif top == "processors" and imported_rank is None:
                violations.append(f"{where}:{line}: imports {imported}, in no layer")
    return violations


def test_the_tree_keeps_the_import_rule() -> None:
    assert layer_violations(REPO_ROOT) == []


def test_a_planted_violation_of_each_kind_is_found(tmp_path: Path) -> None:
    for package in ("processors", "topics"):
        shutil.copytree(REPO_ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    planted = {
        "processors/view/thread_api.py": "import faust\n",
        "processors/processing/outputs.py": "def f() -> None:\n    from aiokafka import X\n",
        "processors/engine/state.py": "from processors.metrics import Metrics\n",
        "processors/engine/codes.py": "import prometheus_client\n",
        "processors/processing/stored_keys.py": "from processors.view import thread_view\n",
        "topics/records.py": "from processors.engine.codes import Outcome\n",
        "processors/tap/sse.py": "import time\n",
        "processors/tap/runs.py": "from processors.config import Settings\n",
    }
    for name, line in planted.items():
        with (tmp_path / name).open("a") as source:
            source.write(line)
    found = layer_violations(tmp_path)
    assert len(found) == len(planted), found
    for name in planted:
        assert any(message.startswith(name + ":") for message in found), (name, found)
