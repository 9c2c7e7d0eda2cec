"""The package's layers, read from its imports: no module imports upward, and the isolated
processes (runner and judge, `engine/child/`) import nothing of kernelwright but `core` and
their own package. `core` imports nothing of kernelwright's above it, and no torch. Every package
has a layer, and the README's layout table names every folder and every module in it."""

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
        if own == "engine.child":
            assert target in ("core", "engine.child"), f"{module} (isolated child) imports {imp}"
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
