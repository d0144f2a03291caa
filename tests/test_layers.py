"""The layers (names as installed, air.*): the three programs stand side by side on protos/ (the wire contract and the code they
share) and never import each other; the runtime a training script imports stands apart from all of
them. Read from the source, every import statement (also those inside functions)."""
import ast
import subprocess
import sys
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
    for line, name in _imported(path):
        parts = name.split(".")
        if parts[0] == "air" and len(parts) > 1 and parts[1] in PACKAGES:
            found.append((line, parts[1]))
    return found


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import; `from air import runtime` names air.runtime."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:   # (relative: a layer crossed unseen)
            out.append((node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, f"{node.module}.{a.name}" if node.module == "air" else node.module)
                    for a in node.names]
    return out


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
    module.write_text("import os\n\ndef f():\n    from air.airnoded.launcher import Launcher\n"
                      "    import air.airctld.events\n    from air import runtime\n")
    assert imports(module) == [(4, "airnoded"), (5, "airctld"), (6, "runtime")]


def test_everything_imports_the_installed_names():
    """air.protos, never protos: a bare name imports only from the repository's root, and any folder
    of that name on a user's path would shadow it. No relative imports either: `from ..airctld import`
    would cross a layer where the first test does not look."""
    bare = []
    for folder in (*PACKAGES, "tests", "bench", "examples", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bare += [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in _imported(path)
                     if name.split(".")[0] in PACKAGES or name.startswith(".")]
    assert not bare, "\n".join(bare)


def test_the_commands_never_import_torch():
    """torch is the runtime's (an extra); a command that imported it would take seconds to start."""
    modules = sorted(f"air.aircli.{p.stem}" for p in (ROOT / "aircli").glob("*.py") if p.stem != "__init__")
    code = f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "False"


def test_the_runtime_and_the_controller_agree_on_the_requeue_exit_code():
    from air import runtime
    from air.protos.states import ExitCode
    assert runtime.REQUEUE_EXIT == ExitCode.REQUEUE == 75


def test_the_tools_call_each_controller_rpc_through_a_typed_method_of_their_client():
    # one method per RPC of the Controller service, named for it, whose annotations are the RPC's own
    # request and reply types; and no tool names an RPC by a string
    import inspect
    import re
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    for rpc in pb.DESCRIPTOR.services_by_name["Controller"].methods:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", rpc.name).lower()
        method = getattr(Client, name, None)
        assert method is not None, f"Client has no method for {rpc.name}"
        hints = inspect.signature(method)
        assert hints.parameters["request"].annotation == f"pb.{rpc.input_type.name}", rpc.name
        assert hints.return_annotation == f"pb.{rpc.output_type.name}", rpc.name
        assert f'self._call("{rpc.name}",' in inspect.getsource(method), rpc.name
    for path in (ROOT / "aircli").glob("*.py"):
        assert not re.search(r"\.call\(\s*[\"']", path.read_text()), f"{path.name} names an RPC by a string"
