"""The package's imports flow one way, with the data: no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_platform"


def _is_module(root: Path, dotted: str) -> bool:
    path = root.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at the top or inside a function (both bind at run time).

    `from package import submodule` depends on the submodule; a package's own `__init__` importing its
    submodules is then no cycle, while `from package import name` (a name the `__init__` defines) is.
    """
    modules: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(root.name):
                named = {f"{node.module}.{alias.name}" for alias in node.names}
                submodules = {n for n in named if _is_module(root, n)}
                deps.update(submodules)
                if named - submodules:  # a name defined in the module itself, not one of its submodules
                    deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith(root.name))
        modules[name] = deps
    return {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycles_in_the_package() -> None:
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def package_modules(graph: dict[str, set[str]], name: str) -> list[str]:
    """`name` and, when it is a package, every module in it: a module split into a package stays checked whole."""
    return sorted(m for m in graph if m == name or m.startswith(name + "."))


def test_package_modules_lists_a_package_and_its_modules_only() -> None:
    graph: dict[str, set[str]] = {"p": set(), "p.a": set(), "p.a.b": set(), "pa": set(), "q": set()}
    assert package_modules(graph, "p") == ["p", "p.a", "p.a.b"]
    assert package_modules(graph, "q") == ["q"]
    assert package_modules(graph, "r") == []


def test_stages_never_import_the_job_or_the_views() -> None:
    graph = import_graph(PACKAGE)
    for stage in ("cdc_platform.stages.latest_state", "cdc_platform.stages.transactions", "cdc_platform.stages.outbox", "cdc_platform.stages.stage"):
        modules = package_modules(graph, stage)
        assert modules, f"{stage} is not in the package"
        for module in modules:
            assert not graph[module] & {"cdc_platform.run.ingest", "cdc_platform.views", "cdc_platform.cli"}, module


def test_stage_packages_never_import_themselves() -> None:
    """`from cdc_platform.stages.latest_state import X` inside the package would run through its `__init__` (a cycle)."""
    graph = import_graph(PACKAGE)
    for package in ("cdc_platform.stages.latest_state", "cdc_platform.stages.transactions", "cdc_platform.stages.outbox"):
        for module in package_modules(graph, package):
            if module != package:
                assert package not in graph[module], module


def test_the_readme_module_map_matches_the_package() -> None:
    """Every module of the package is in the README's map (## Layout), and every module the map names exists."""
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    named = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line.split()[0].endswith((".py", "/"))}
    packages = {p.parent.name + "/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE and p.parent.parent.name != "testbed"}
    modules = {p.name for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py") and p.parent.name != "testbed"}
    assert packages | modules == named, f"missing from the README: {sorted((packages | modules) - named)}; not in the package: {sorted(named - packages - modules)}"


#: The developers' guide: one module per idea, none past about 600 lines. A module that outgrows it is
#: split along its seams (as `envelope` -> `parsed_batches`, `config` -> `config_source`), not trimmed.
MAX_MODULE_LINES = 600


def test_no_module_of_the_package_is_past_the_guides_length() -> None:
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert lengths, "no modules found"
    assert {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def test_a_cdc_sql_answered_by_a_server_loads_neither_spark_nor_the_lake_nor_the_object_store() -> None:
    """`cdc sql` against a running `cdc serve` is a process per query: what it imports is on the lookup's
    path. The command line, the server's client and the row formats must not pull pyarrow, pyspark, the
    views' SQL builders or universal_pathlib (a package `__init__` that imported `serve.server` did: ~0.4 s)."""
    import subprocess
    import sys

    probe = ("import sys, cdc_platform.cli, cdc_platform.serve.sql_client, cdc_platform.serve.formats;"
             "print(sorted(m for m in ('pyarrow', 'pyspark', 'upath', 'fsspec', 'numpy', 'cdc_platform.views', 'cdc_platform.lake') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
