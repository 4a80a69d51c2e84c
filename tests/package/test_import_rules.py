"""The package's layering, read from the source with `ast` (nothing is imported):

- nothing outside `lightning_mccl/cli/` (the `mccl` command's front ends) imports a module of it, but for
  tests of the command itself through `lightning_mccl.cli.main` (`python -m lightning_mccl.cli` is a string,
  not an import); the launcher the command fronts is the library `lightning_mccl.launcher`;
- no `_private` name of ours (a function, class or constant whose name starts with one underscore) is
  imported from another module, and a private module (`_C`, `_backend`, ...) only by its own package;
- no module of src/ reads a file when it is imported (a module-level read_text, read_bytes or open).

Imports found in src/, tests/ and benchmarks/; "ours" is lightning_mccl and the modules of tests/ and
benchmarks/ (torch's and Lightning's private names are theirs to use).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
FOLDERS = ("src", "tests", "benchmarks")


def _python_files() -> Iterator[Path]:
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _module_name(path: Path) -> str:
    """The dotted name a file is imported as: lightning_mccl.x.y under src/, else its stem (tests and
    benchmarks put their folders on sys.path) or, inside a package folder there, package.stem."""
    if path.is_relative_to(SRC):
        parts = path.relative_to(SRC).with_suffix("").parts
    else:
        parts = [path.stem]
        parent = path.parent
        while (parent / "__init__.py").exists():
            parts.insert(0, parent.name)
            parent = parent.parent
    return ".".join(p for p in parts if p != "__init__")


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _local_names() -> set:
    """Top-level names that are ours in tests/ and benchmarks/: their modules and package folders."""
    names = {"lightning_mccl"}
    for folder in ("tests", "benchmarks"):
        for p in (ROOT / folder).rglob("*.py"):
            names.add(p.stem)
            if (p.parent / "__init__.py").exists():
                names.add(p.parent.name)
    return names


def _module_exists(dotted: str) -> bool:
    """Whether `dotted` names a module or package of src/ (a .py, a package folder or a built extension)."""
    if not dotted.startswith("lightning_mccl"):
        return False
    base = SRC.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or base.is_dir() or bool(list(base.parent.glob(base.name + ".*.so")))


def _imports(path: Path) -> Iterator[Tuple[int, str, Optional[str]]]:
    """(line, module, name) of every import in `path`, relative ones resolved: `import a.b` gives (a.b, None),
    `from a import b` gives (a, b)."""
    this = _module_name(path)
    package = this if _is_package(path) else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            for alias in node.names:
                yield node.lineno, module, alias.name


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_nothing_outside_cli_imports_a_module_of_it():
    found = []
    for path in _python_files():
        rel = path.relative_to(ROOT)
        if rel.parts[:3] == ("src", "lightning_mccl", "cli"):
            continue
        for line, module, name in _imports(path):
            target = module if name is None or _module_exists(f"{module}.{name}") is False else f"{module}.{name}"
            if not (target == "lightning_mccl.cli" or target.startswith("lightning_mccl.cli.")):
                continue
            if rel.parts[0] == "tests" and module == "lightning_mccl.cli" and name == "main":
                continue  # a test of the command itself
            found.append(f"{rel}:{line}: {target if name is None else f'from {module} import {name}'}")
    assert not found, "modules of lightning_mccl.cli imported from outside it:\n" + "\n".join(found)


def test_no_private_name_is_imported_from_another_module():
    ours = _local_names()
    found: List[str] = []
    for path in _python_files():
        rel = str(path.relative_to(ROOT))
        this = _module_name(path)
        package = this if _is_package(path) else this.rpartition(".")[0]
        for line, module, name in _imports(path):
            if module.split(".")[0] not in ours:
                continue  # torch's, Lightning's: theirs
            full = module if name is None else f"{module}.{name}"
            parts = full.split(".")
            for i, part in enumerate(parts):
                if not _private(part):
                    continue
                owner = ".".join(parts[:i])  # the package (or module) the private name belongs to
                is_module = _module_exists(".".join(parts[:i + 1]))
                if is_module and owner == package:
                    continue  # a package's own private module, used inside that package
                bad = ".".join(parts[:i + 1])
                found.append(f"{rel}:{line}: {bad}")
                break
    assert not found, "private names imported across modules or packages:\n" + "\n".join(found)


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node that runs when the module is imported: outside function bodies (class bodies run)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(node.decorator_list if not isinstance(node, ast.Lambda) else [])
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def test_no_module_of_src_reads_a_file_when_imported():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in _module_level(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            if called in ("read_text", "read_bytes", "open"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {called}()")
    assert not found, "files read at import:\n" + "\n".join(found)


def test_the_rules_see_what_they_are_about():
    """The walk finds the imports it judges (a rule that saw nothing would pass vacuously)."""
    seen = {(module, name) for line, module, name in _imports(SRC / "lightning_mccl" / "cli" / "launch.py")}
    assert ("lightning_mccl.launcher", "run_job") in seen and ("lightning_mccl.cli.arg_types", "positive_int") in seen
    assert _module_exists("lightning_mccl._C") and _module_exists("lightning_mccl.cli.launch")
    assert not _module_exists("lightning_mccl.launcher.run_job")
    tree = ast.parse("import io\nX = open('f')\ndef f():\n    return open('g')\n")
    assert [n.lineno for n in _module_level(tree) if isinstance(n, ast.Call)] == [2]
