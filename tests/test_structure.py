"""ksim's modules depend in one direction: no module imports, even for type checking or inside a function,
a module that imports it back."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ksim"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ksim_imports(path: Path, modules: set[str]) -> set[str]:
    """The ksim modules `path` imports anywhere in its source (top level, `if TYPE_CHECKING:`, functions)."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from ksim import engine` imports the module ksim.engine; `from ksim.engine import X` ksim.engine.
            imported |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return {name for name in imported if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph = {module_name(path): ksim_imports(path, modules) for path in paths}
    # The package itself (ksim/__init__.py) runs first whichever submodule is imported: not an edge.
    return {module: {dep for dep in deps if dep not in ("ksim", "ksim.task")} for module, deps in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all its imports are explored

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep, [*path, dep])):
                return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_no_import_cycle_among_ksim_modules() -> None:
    graph = import_graph()
    assert {"ksim.task.rl", "ksim.task.env", "ksim.task.loop", "ksim.engine"} <= set(graph)
    assert "ksim.task.types" in graph["ksim.task.env"]  # the graph does see imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_type_checking_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_task_layer_imports_nothing_above_it() -> None:
    """Nothing under ksim/task/ imports a mode, the viewer or a benchmark (modes take a built task)."""
    graph = import_graph()

    def above(dep: str) -> bool:
        return dep in ("ksim.viewer", "ksim.viewer_sim") or dep.startswith(("ksim.modes", "benchmarks"))

    for module, deps in graph.items():
        if module.startswith("ksim.task."):
            assert not [dep for dep in deps if above(dep)], module


def test_rl_task_keeps_what_a_task_defines() -> None:
    """RLTask stays the task's definition and its programs: at most 400 lines and 45 methods."""
    path = PACKAGE / "task" / "rl.py"
    source = path.read_text()
    (task_class,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "RLTask"]
    methods = [n for n in task_class.body if isinstance(n, ast.FunctionDef)]
    assert len(source.splitlines()) <= 400
    assert len(methods) <= 45
