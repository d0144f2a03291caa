import hashlib
from pathlib import Path

import pytest

from cluster import LocalCluster
from fakeclock import Clock, build

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protos", "airctld", "airnoded", "aircli", "runtime")


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".proto", ".c")}


def pytest_sessionstart(session):
    """The tests and the daemons they start run the installed air.* package: it must be this checkout's."""
    import air.protos
    installed = Path(air.protos.__file__).resolve().parent.parent
    stale = [name for name in PACKAGES if _tree(installed / name) != _tree(ROOT / name)]
    if not stale and not (installed / "airnoded" / "air-shepherd").is_file():
        stale = ["airnoded (its shepherd program was not built: is there a C compiler?)"]
    if stale:
        pytest.exit(f"the installed air package ({installed}) differs from this checkout in {', '.join(stale)}: "
                    "run `bash scripts/setup.sh` first", returncode=2)

LOG_LINES = 40   # of each daemon's log, shown under a failed test that used a cluster


@pytest.fixture
def controller(tmp_path):
    """A controller in this process on a clock the test moves (fakeclock.build), and that clock."""
    clock = Clock()
    c = build(tmp_path, clock, clock)
    yield c, clock
    c.stop()


@pytest.fixture(scope="module")
def cluster(request):
    """The module's cluster, up for its tests and taken down after them, on loopback addresses of its own:
    LocalCluster's defaults (2 nodes with 4 simulated GPUs each, node timeout 6 s), or what the module's
    CLUSTER says: LocalCluster's keyword arguments, or a function of the pytest request that builds the
    cluster (not started), for what is settled at run time (a munged of the module's, a health program)."""
    settings = getattr(request.module, "CLUSTER", {})
    c = settings(request) if callable(settings) else LocalCluster(**settings)
    c.up()
    yield c
    c.down()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a cluster shows the end of each daemon's log: on a CI machine the
    cluster's folder is gone by the time anyone looks."""
    outcome = yield
    report = outcome.get_result()
    c = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if not report.failed or not isinstance(c, LocalCluster):
        return
    for log in sorted((c.dir / "log").glob("*.log")):
        try:
            lines = log.read_text(errors="replace").splitlines()[-LOG_LINES:]
        except OSError as e:
            lines = [f"(unreadable: {e})"]
        report.sections.append((f"{log.name} (last {LOG_LINES} lines)", "\n".join(lines)))


@pytest.fixture(params=["program", "python", "spawner"])
def shepherd_kind(request, monkeypatch, tmp_path):
    """Each test that takes it runs with each shepherd: the C program (shepherd.c, what the daemon
    starts where it was built) and shepherd.py (where it was not), started as a Python of its own or
    forked by the daemon's spawner (shepherd.py --serve; its calls to shepherding.spawn get one)."""
    import functools
    from air.airnoded import shepherding
    if request.param == "program":
        assert shepherding.native() is not None, "the shepherd program (air-shepherd) was not built"
        yield request.param
        return
    monkeypatch.setattr(shepherding, "native", lambda: None)
    if request.param == "python":
        yield request.param
        return
    folder = tmp_path / "spawner"
    folder.mkdir()
    spawner = shepherding.Spawner(folder)
    monkeypatch.setattr(shepherding, "spawn", functools.partial(shepherding.spawn, spawner=spawner))
    yield request.param
    spawner.close()
