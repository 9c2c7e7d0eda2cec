"""The package's layers, read from its imports: no module imports upward, and the isolated
processes (runner and judge, `engine/child/`) import nothing of kernelwright but `core` and
their own package. `core` imports nothing of kernelwright's above it, and no torch. Every package
has a layer, and the README's layout table names every folder and every module in it. No two
modules import each other, directly or round a loop, counting imports inside functions and those
for type checkers only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "src" / "kernelwright"
# lower number = lower layer; a module may import its own layer and the ones below
# Every package under src/kernelwright/ is named here (a test checks it), so a new folder gets a layer on purpose.
LAYERS = {
    "core": 0,
    "engine.child": 1,
    "engine.child.timing": 1,
    "engine": 2,
    "engine.isolation": 2,
    "engine.extensions": 2,
    "models": 3,
    "models.prompts": 3,
    "loop": 4,
    "store": 5,
    "suites": 5,
    "executors": 5,
    "report": 6,
    "cli": 6,
    "api": 6,
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kernelwright":
        return None
    rest = ".".join(parts[1:])
    best = None
    for name in LAYERS:
        if rest == name or rest.startswith(name + "."):
            if best is None or len(name) > len(best):
                best = name
    return best


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        yield ".".join(rel.parts).removesuffix(".__init__"), path


@pytest.mark.parametrize("module,path", list(modules()), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_no_module_imports_a_layer_above_its_own(module, path):
    own = layer_of(module)
    if own is None:
        return
    for imp in imports(path):
        target = layer_of(imp)
        if target is None:
            continue
        if own.startswith("engine.child"):
            assert target in ("core", "engine.child", "engine.child.timing"), f"{module} (isolated child) imports {imp}"
        else:
            assert LAYERS[target] <= LAYERS[own], f"{module} ({own}) imports {imp} ({target}), a layer above"


def test_core_is_standard_library_only():
    for path in (PKG / "core").glob("*.py"):
        for imp in imports(path):
            assert not imp.startswith(("torch", "rich", "typer", "jinja2", "openai", "anthropic", "numpy")), (
                f"{path.name} imports {imp}"
            )


def folders() -> list[Path]:
    """Every folder under src/kernelwright/ (caches aside), relative to it."""
    return sorted(p.relative_to(PKG) for p in PKG.rglob("*") if p.is_dir() and p.name != "__pycache__")


def test_every_package_has_a_layer():
    packages = [f for f in folders() if (PKG / f / "__init__.py").is_file()]
    assert packages, "no package found under src/kernelwright/"
    for folder in packages:
        name = ".".join(folder.parts)
        assert name in LAYERS, f"src/kernelwright/{folder}/ has no entry in LAYERS: give it a layer"
    for name in LAYERS:
        path = PKG / name.replace(".", "/")
        assert (path / "__init__.py").is_file() or path.with_suffix(".py").is_file(), (
            f"LAYERS names {name}, which is neither a package nor a top-level module"
        )


def _layout_rows() -> dict[str, str]:
    """The README's layout table: its rows by the folder that starts them ("| `engine/child/` | ...")."""
    readme = (PKG.parent.parent / "README.md").read_text()
    start = readme.index("## Layout")
    end = readme.find("\n## ", start + 1)
    rows = {}
    for line in readme[start : end if end != -1 else len(readme)].splitlines():
        if line.startswith("| `") and "/` |" in line:
            rows[line[3 : line.index("/` |")] + "/"] = line
    return rows


def test_the_readme_layout_table_names_every_folder_and_its_modules():
    rows = _layout_rows()
    for folder in folders():
        key = folder.as_posix() + "/"
        assert key in rows, f"README's layout table has no row for src/kernelwright/{key}"
        for path in sorted((PKG / folder).glob("*.py")):
            if path.name != "__init__.py":
                assert f"`{path.name}`" in rows[key], f"README's layout row for {key} does not name {path.name}"
    for key in rows:
        assert (PKG / key).is_dir(), f"README's layout table names {key}, which is not a folder of src/kernelwright/"


# ---- one name per job ------------------------------------------------------------------------------


def test_no_two_modules_share_a_name():
    by_name: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(PKG)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, "; ".join(f"{' and '.join(p)} share a name: name each for what it does" for p in shared.values())


# ---- import cycles ---------------------------------------------------------------------------------

# Cycles that other work removes; each entry goes when its modules no longer import each other
# (`test_a_known_cycle_is_still_there` says when).
KNOWN_CYCLES: set[frozenset[str]] = set()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out.update(id(n) for b in node.body for n in ast.walk(b))
    return out


def module_imports(path: Path, module: str, known: set[str]) -> list[tuple[str, int]]:
    """The package's modules `module` imports (at `path`), each with its line: at module level, inside
    functions, relative or absolute. `from a.b import c` is a.b.c where that is a module, else a.b.
    An `__init__`'s imports for type checkers only are left out (it hands names on lazily, and
    `import kernelwright` for `__file__` would otherwise close a loop through every name it hands on);
    any other module's count: a type is a dependency as much as a call is."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    skip = _type_checking_only(tree) if is_package else set()
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                if f"{source}.{a.name}" in known:
                    out.append((f"{source}.{a.name}", node.lineno))
                elif source in known:
                    out.append((source, node.lineno))
    return out


def import_cycles(graph: dict[str, list[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, []))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def package_graph() -> tuple[dict[str, list[str]], dict[str, list[tuple[str, int]]]]:
    paths = dict(modules())
    edges = {m: module_imports(p, m, set(paths)) for m, p in paths.items()}
    return {m: [t for t, _ in e if t != m] for m, e in edges.items()}, edges


def test_no_import_cycle_between_modules():
    graph, edges = package_graph()
    for cycle in import_cycles(graph):
        if cycle in KNOWN_CYCLES:
            continue
        lines = sorted(
            {
                f"{m.removeprefix('kernelwright.')} line {line} imports {t.removeprefix('kernelwright.')}"
                for m in cycle
                for t, line in edges[m]
                if t in cycle and t != m
            }
        )
        raise AssertionError(
            "import cycle: " + "; ".join(lines) + ". Move what both need into a module of its own below them"
        )


def test_a_known_cycle_is_still_there():
    found = set(import_cycles(package_graph()[0]))
    for cycle in KNOWN_CYCLES:
        gone = not any(cycle <= f for f in found)
        assert not gone, f"{sorted(cycle)} no longer import each other: remove it from KNOWN_CYCLES"


def _write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    out = {}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rel_mod = Path(rel).with_suffix("")
        out[".".join(rel_mod.parts).removesuffix(".__init__")] = path
    return out


def test_the_cycle_check_sees_imports_hidden_in_functions_type_checking_and_relative_form(tmp_path):
    """The ways a cycle is hidden in practice: an import inside a function (the usual trick), one for
    type checkers only, a relative import, and a loop of three; a package's lazy re-exports for type
    checkers and an import of the module by itself are no cycle."""
    paths = _write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
            "pkg/a.py": "import pkg\ndef f():\n    from pkg.b import g  # hidden\n    return g\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
            "pkg/c.py": "from . import d\n",
            "pkg/d.py": "from .e import x\n",
            "pkg/e.py": "def x():\n    from pkg import c\n    return c\n",
            "pkg/f.py": "import pkg.f\n",
        },
    )
    known = set(paths)
    graph = {m: [t for t, _ in module_imports(p, m, known) if t != m] for m, p in paths.items()}
    assert sorted(map(sorted, import_cycles(graph))) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d", "pkg.e"]]


# ---- sizes -----------------------------------------------------------------------------------------

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 150  # from its first decorator to its last line, nested functions counted in it


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """The functions and methods of `source` over `limit` lines: (qualified name, first line, lines)."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    lines = (child.end_lineno or child.lineno) - first + 1
                    if lines > limit:
                        out.append((name, first, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_no_module_is_over_800_lines():
    for _, path in modules():
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_MODULE_LINES, (
            f"{path.relative_to(PKG)} is {lines} lines (at most {MAX_MODULE_LINES}): split it by what its parts do"
        )


def test_no_function_is_over_150_lines():
    found = [
        f"{path.relative_to(PKG)}:{line} {name} ({lines} lines)"
        for _, path in modules()
        for name, line, lines in long_functions(path.read_text())
    ]
    assert not found, (
        f"over {MAX_FUNCTION_LINES} lines: {'; '.join(found)}. Move its steps into functions named for them"
    )


def test_the_size_check_counts_decorators_and_sees_methods_and_nested_functions():
    def body(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    source = (
        "@app.command('x')\ndef command():\n"
        + body(149, "    ")  # 151 lines with its decorator
        + "def fits():\n"
        + body(149, "    ")  # 150
        + "class C:\n    async def method(self):\n"
        + body(150, "        ")  # 151
        + "def outer():\n    def inner():\n"
        + body(150, "        ")
        + "    return inner\n"  # 153, inner 151
    )
    assert [(name, lines) for name, _, lines in long_functions(source)] == [
        ("command", 151),
        ("C.method", 151),
        ("outer", 153),
        ("outer.inner", 151),
    ]
