"""The layers: the three programs stand side by side on protos/ (the wire contract and the code they
share) and never import each other; the runtime a training script imports stands apart from all of
them. Read from the source, every import statement (also those inside functions)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protos", "airctld", "airnoded", "aircli", "runtime")
MAY_IMPORT = {
    "protos": set(),
    "airctld": {"protos"},
    "airnoded": {"protos"},
    "aircli": {"protos"},
    "runtime": set(),
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module that names one of ours."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n.split(".")[0]) for n in names if n.split(".")[0] in PACKAGES]
    return found


def test_no_program_imports_another_and_the_runtime_stands_apart():
    crossings = []
    for package in PACKAGES:
        files = sorted((ROOT / package).rglob("*.py"))
        assert files, package
        for path in files:
            for line, target in imports(path):
                if target != package and target not in MAY_IMPORT[package]:
                    crossings.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not crossings, "\n".join(crossings)


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from airnoded.launcher import Launcher\n    import airctld.events\n")
    assert imports(module) == [(4, "airnoded"), (5, "airctld")]
