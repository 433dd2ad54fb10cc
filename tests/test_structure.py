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
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            names_only = len(submodules) < len(node.names)
            imported |= submodules | ({node.module} if names_only else set())
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


# ksim's layers from the bottom up (docs/architecture.md): a module imports only from its own layer or below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base and robot side",
        (
            "ksim.errors", "ksim.config", "ksim.xla_setup", "ksim.reporting", "ksim.wandb_logging", "ksim.plot",
            "ksim.checkpoint", "ksim.geom_mesh", "ksim.render", "ksim.policy_spec", "ksim.runtime", "ksim.motion",
            "ksim.assets",
        ),
    ),
    ("physics", ("ksim.engine", "ksim.physics")),
    (
        "components",
        (
            "ksim.binding", "ksim.stateful", "ksim.terrain", "ksim.observations", "ksim.rewards",
            "ksim.terminations", "ksim.resets", "ksim.actuators", "ksim.randomization", "ksim.commands",
            "ksim.events", "ksim.mirror", "ksim.viewer_settings", "ksim.tracking",
        ),
    ),
    ("deployment", ("ksim.deploy",)),
    ("learner", ("ksim.learner",)),
    ("env and tasks", ("ksim.task",)),
    ("viewer", ("ksim.viewer",)),
    ("modes", ("ksim.modes", "ksim.sim2sim")),
    ("tools", ("ksim.tools", "ksim.inspect")),
]  # fmt: skip


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer that holds `module` (the longest prefix that names it)."""
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer of tests/test_structure.py's LAYERS"
    return max(matches)[1]


def test_every_module_imports_only_its_own_layer_or_below() -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
        for module, deps in import_graph().items()
        if module != "ksim"
        for dep in sorted(deps)
        if layer_of(dep) > layer_of(module)
    ]
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert layer_of("ksim.task.env") > layer_of("ksim.observations") > layer_of("ksim.engine")
    assert layer_of("ksim.tools.gait_stats") == len(LAYERS) - 1


def imports_of(folder: Path) -> dict[str, set[str]]:
    """Each module file under `folder` with the top-level packages it imports anywhere."""
    found = {}
    for path in folder.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(folder.parent))] = names
    return found


def test_benchmarks_only_measure() -> None:
    """Nothing in ksim/ or examples/ imports benchmarks/; ksim imports no example."""
    root = PACKAGE.parent
    library = {**imports_of(PACKAGE), **imports_of(root / "examples")}
    assert [path for path, names in library.items() if "benchmarks" in names] == []
    assert [path for path, names in imports_of(PACKAGE).items() if "examples" in names] == []
