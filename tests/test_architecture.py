"""The folder listing is the architecture: these tests keep its rules true
(docs/architecture.md, "The folder map").

    shared/                imports neither torch nor engine/, gateway/, ops/
    pageserve_kernels/     imports neither engine/, gateway/ nor ops/
    engine/ <-> gateway/   never import each other
    engine/scheduling/     pure Python: no torch, no zmq (tested fast on any machine)
    no import loops between modules; no module over 400 lines, no function over 60
    (a Triton kernel body, `@triton.jit`, is one unit the compiler sees whole and is excepted)

Imports are read from the source (every `import`, at module level, inside functions and under
TYPE_CHECKING alike), so a lazy import cannot hide a dependency from these rules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gateway", "pageserve_kernels", "shared", "ops")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module of ours that `name` imports, resolved to the longest known module name."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` depends on pkg.sub alone when sub is a module, else on pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _external_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("shared", {"engine", "gateway", "ops", "pageserve_kernels"}),
        ("pageserve_kernels", {"engine", "gateway", "ops"}),
        ("engine", {"gateway", "ops"}),
        ("gateway", {"engine", "ops", "pageserve_kernels"}),
    ],
)
def test_packages_import_only_downward(package: str, forbidden: set[str]) -> None:
    wrong = sorted(
        f"{name} -> {dep}" for name, deps in GRAPH.items() if _top(name) == package
        for dep in deps if _top(dep) in forbidden
    )
    assert not wrong, wrong


def test_scheduling_part_is_pure_python() -> None:
    heavy = {"torch", "zmq", "numpy", "triton"}
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {sorted(_external_imports(path) & heavy)}"
        for name, path in MODULES.items()
        if name.startswith("engine.scheduling") and _external_imports(path) & heavy
    )
    assert not wrong, wrong
    # And at run time: the scheduler and everything it pulls in load no heavy module.
    code = (
        "import sys, engine.scheduling.scheduler, engine.scheduling.checks; "
        "heavy = sorted(m for m in ('torch', 'zmq', 'numpy', 'triton') if m in sys.modules); "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_loops() -> None:
    loops = _cycles()
    assert not loops, loops


def _is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def test_modules_and_functions_fit_on_a_screen() -> None:
    wrong = []
    for name, path in MODULES.items():
        source = path.read_text()
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            wrong.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_triton_kernel(node):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    wrong.append(f"{name}.{node.name}: {length} lines")
    assert not wrong, wrong
