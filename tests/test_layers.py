"""The package's layers, read from its imports: no module imports upward, and the isolated
processes (runner and judge, `engine/child/`) import nothing of kernelwright but `core` and
their own package. `core` imports nothing of kernelwright's above it, and no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "src" / "kernelwright"
# lower number = lower layer; a module may import its own layer and the ones below
LAYERS = {
    "core": 0,
    "engine.child": 1,
    "engine": 2,
    "models": 3,
    "loop": 4,
    "store": 5, "suites": 5, "executors": 5,
    "report": 6, "cli": 6, "api": 6,
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
        if own == "engine.child":
            assert target in ("core", "engine.child"), f"{module} (isolated child) imports {imp}"
        else:
            assert LAYERS[target] <= LAYERS[own], f"{module} ({own}) imports {imp} ({target}), a layer above"


def test_core_is_standard_library_only():
    for path in (PKG / "core").glob("*.py"):
        for imp in imports(path):
            assert not imp.startswith(("torch", "rich", "typer", "jinja2", "openai", "anthropic", "numpy")), \
                f"{path.name} imports {imp}"


def test_the_readme_layout_table_names_the_folders_that_exist():
    readme = (PKG.parent.parent / "README.md").read_text()
    for folder in ("core/", "engine/", "engine/child/", "models/", "loop/", "store/", "executors/", "cli/"):
        assert folder in readme, f"README's layout does not mention {folder}"
        assert (PKG / folder).is_dir()
