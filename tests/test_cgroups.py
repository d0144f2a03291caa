"""Per-job cgroups: a memory limit that ends a job as OUT_OF_MEMORY, and a kill that reaches processes
that left the job's process group. On a host without a writable hierarchy the daemon says so."""
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from air.airnoded.cgroups import JobCgroups, detect, node_folder
from air.protos.limits import memory_limit_bytes
from cluster import wait_for

MODE = detect()


def test_limits_and_layout_on_a_cgroup_tree(tmp_path):
    for mode, limit_file in (("v1", "memory/air/n1/job7.0/memory.limit_in_bytes"),
                             ("v2", "air/n1/job7.0/memory.max")):
        root = tmp_path / mode
        root.mkdir()
        groups = JobCgroups("n1", root=root, mode=mode)
        path = groups.create(7, 0, memory_limit_bytes(0, 512, 2))
        assert (root / limit_file).read_text() == str(1024 * 1024 * 1024)
        assert path == root / Path(limit_file).parent and groups.current(7) == path
        second = groups.create(7, 1, 0)    # a requeued run gets a group of its own
        assert second != path and groups.current(7) == second
        apart = JobCgroups("n1", root=root, mode=mode, spool=tmp_path / "other-spool")
        assert apart.base.parent == groups.base.parent and apart.base.name.startswith("n1.") \
            and apart.create(7, 0, 0) != path   # another daemon named n1 on this host: groups of its own
    assert memory_limit_bytes(100, 512, 2) == 100 * 1024 * 1024
    assert memory_limit_bytes(0, 0, 8) == 0


def test_the_task_bound_on_a_cgroup_tree(tmp_path):
    # v2: the memory and pids controllers enabled in every folder above the runs' groups, the node's own
    # included (a group gets a controller's files only when its parent's subtree_control enables it)
    root = tmp_path / "v2"
    node = root / "air" / "n1"
    node.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for folder in (root, root / "air", node):
        (folder / "cgroup.subtree_control").write_text("")
    groups = JobCgroups("n1", root=root, mode="v2", pids_max=100)
    for folder in (root, root / "air", node):
        assert (folder / "cgroup.subtree_control").read_text() == "+pids"   # (the fake keeps the last write)
    assert groups.pids_max == 100
    # v1: a group of the same name in the pids hierarchy, with the bound
    root = tmp_path / "v1"
    (root / "pids").mkdir(parents=True)
    (root / "pids" / "cgroup.procs").write_text("")
    groups = JobCgroups("n1", root=root, mode="v1", pids_max=100)
    path = groups.create(7, 0, 0)
    from air.airnoded.cgroups import joined
    assert joined(path) == [path, root / "pids" / "air" / "n1" / "job7.0"]
    assert (root / "pids" / "air" / "n1" / "job7.0" / "pids.max").read_text() == "100"
    # no pids hierarchy: no bound, and the memory groups work as before
    root = tmp_path / "v1-no-pids"
    root.mkdir()
    groups = JobCgroups("n1", root=root, mode="v1", pids_max=100)
    assert groups.pids_max == 0 and groups.create(7, 0, 0) == root / "memory" / "air" / "n1" / "job7.0"


@pytest.mark.skipif(MODE != "none", reason="this host has a writable cgroup hierarchy; see the tests below")
def test_without_cgroups_the_daemon_says_so(cluster):
    logs = [p for p in (cluster.dir / "log").glob("*.log") if p.name != "airctld.log"]
    assert logs and all("tracked by process group only" in p.read_text() for p in logs)


@pytest.mark.skipif(MODE == "none", reason="no writable cgroup hierarchy on this host (checked by the test above)")
def test_memory_limit_ends_the_job_out_of_memory(cluster):
    hog = cluster.write_script("hog.sh", f"#!/bin/sh\nexec {sys.executable} -c '"
                               "b = [bytearray(16 << 20) for _ in range(40)]; print(len(b))'\n")
    job = cluster.submit(hog, "--mem=64M")
    done = cluster.wait_state(job, "OUT_OF_MEMORY", "COMPLETED", "FAILED", timeout=30)
    assert done["state"] == "OUT_OF_MEMORY" and done["reason"] == "OutOfMemory"
    assert cluster.cli("airq", "-j", str(job), "-h", "-t", "all", "-o", "%t").stdout.strip() == "OOM"
    fits = cluster.submit(hog, "--mem=2G")
    assert cluster.wait_state(fits, "COMPLETED", "OUT_OF_MEMORY", "FAILED", timeout=30)["state"] == "COMPLETED"


@pytest.mark.skipif(MODE == "none", reason="no writable cgroup hierarchy on this host (checked by the test above)")
def test_cancel_reaches_processes_that_left_the_job_group(cluster, tmp_path):
    marker = cluster.work / "escaped.pid"
    script = cluster.write_script("escape.sh", f"#!/bin/sh\nsetsid sh -c 'echo $$ > {marker}; exec sleep 300' &\n"
                                  "sleep 300\n")
    job = cluster.submit(script)
    cluster.wait_state(job, "RUNNING")
    pid = int(wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the escaped process"))
    assert os.getpgid(pid) != os.getpgid(os.getpid()) and psutil.pid_exists(pid)
    cluster.cli("aircancel", str(job))
    cluster.wait_state(job, "CANCELLED", timeout=40)
    wait_for(lambda: _gone(pid),
             timeout=10, what="the escaped process to be killed")


@pytest.mark.skipif(MODE == "none", reason="no writable cgroup hierarchy on this host (checked by the test above)")
def test_ranks_on_a_node_without_the_batch_script_are_held_in_a_cgroup_of_the_run(cluster):
    """On the node where only ranks run, what a rank starts and detaches (setsid) dies when the job is
    cancelled, and --mem holds there too: a rank that goes over it is killed by the kernel."""
    marker = cluster.work / "rank-escaped.pid"
    rank = cluster.write_script("rank.sh", f"#!/bin/sh\n[ \"$SLURM_NODEID\" = 1 ] || exec sleep 300\n"
                                f"setsid sh -c 'echo $$ > {marker}; exec sleep 300' &\nexec sleep 300\n")
    job = cluster.submit(cluster.write_script("two.sh", f"#!/bin/sh\nairrun -N 2 --ntasks-per-node=1 sh {rank}\n"),
                         "-N", "2", "--gpus-per-node=1", "--mem=1G")
    cluster.wait_state(job, "RUNNING")
    pid = int(wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the escaped process"))
    # (this cluster's groups only: another cluster's job may have the same number)
    folder = f"air/{node_folder('node02', cluster.dir / 'spool' / 'node02')}/job{job}.0"
    groups = [g for pattern in (folder, f"*/{folder}") for g in Path("/sys/fs/cgroup").glob(pattern) if g.is_dir()]
    assert any(str(pid) in (g / "cgroup.procs").read_text().split() for g in groups), groups
    cluster.cli("aircancel", str(job))
    cluster.wait_state(job, "CANCELLED", timeout=40)
    wait_for(lambda: _gone(pid),
             timeout=10, what="the escaped process to be killed")

    hog = cluster.write_script("rank-hog.sh", f"#!/bin/sh\n[ \"$SLURM_NODEID\" = 1 ] || exit 0\nexec {sys.executable} "
                               "-c 'b = [bytearray(16 << 20) for _ in range(40)]; print(len(b))'\n")
    over = cluster.submit(cluster.write_script("hog2.sh", f"#!/bin/sh\nairrun -N 2 --ntasks-per-node=1 sh {hog}\n"),
                          "-N", "2", "--gpus-per-node=1", "--mem=200M", "--no-requeue")
    done = cluster.wait_state(over, "COMPLETED", "FAILED", "OUT_OF_MEMORY", timeout=60)
    # the rank on node02 was killed by the kernel (SIGKILL: airrun ends 128 + 9); airrun on node01 fit
    assert done["state"] == "FAILED" and done["exit_code"] == 137, done
    fits = cluster.submit(cluster.write_script("hog3.sh", f"#!/bin/sh\nairrun -N 2 --ntasks-per-node=1 sh {hog}\n"),
                          "-N", "2", "--gpus-per-node=1", "--mem=2G")
    assert cluster.wait_state(fits, "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"


def test_a_steps_group_is_the_batch_scripts_where_it_runs_and_the_runs_own_elsewhere(tmp_path):
    """On a fake cgroup tree: ranks join the batch script's group on its node (never one of their own that
    the last step would empty, killing the script), and a run's own group on a node with ranks only."""
    from air.airnoded.steps import StepRunner
    from air.protos import air_pb2 as pb
    root = tmp_path / "cg"
    root.mkdir()
    groups = JobCgroups("n1", root=root, mode="v1", spool=tmp_path / "spool")
    runner = StepRunner("n1", "127.0.0.1", groups)
    step = pb.Step(job_id=7, run=2, nodes=[pb.StepNode(node="n1", memory_limit_bytes=64 << 20)])
    batch_dir, ranks_dir = tmp_path / "batch-node", tmp_path / "ranks-node"
    batch_dir.mkdir()
    ranks_dir.mkdir()
    batch_group = groups.create(7, 2, 0)                     # what the launcher made for the script
    (batch_dir / "batch.record").write_text(f"shepherd 1 2 3\ncgroup {batch_group}\n")   # and its shepherd recorded
    assert runner.run_group(step, 0, batch_dir) == batch_group
    assert 7 not in {k[0] for k in runner._own_groups}      # not the steps' to remove
    groups.remove(batch_group)
    own = runner.run_group(step, 0, ranks_dir)
    assert own == groups.base / "job7.2" and (own / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (ranks_dir / "cgroup").read_text() == str(own)   # for the fence keeper and a daemon that adopts them
    assert runner.run_group(step, 0, ranks_dir) == own      # a second step of the run joins the same group
    assert runner.has_ranks(7, 2)
    earlier = tmp_path / "earlier-daemon"   # a daemon of an earlier version left ranks in a group of its own
    earlier.mkdir()
    older = root / "memory" / "air" / "n1" / "job8.0"
    older.mkdir(parents=True)
    (earlier / "cgroup").write_text(str(older))
    assert runner.run_group(pb.Step(job_id=8, run=0, nodes=[pb.StepNode(node="n1")]), 0, earlier) == older
    assert older in groups.leftovers()   # and a restarted daemon would find it to kill, were no run to own it


def test_a_step_that_comes_while_the_batch_script_starts_never_takes_its_group_for_its_own(tmp_path):
    """airrun's own allocation starts a step as soon as its job runs, which can reach the batch node
    before the launcher has started (or even recorded) the script's group. The step joins that group and
    its end must never kill what is in it (the script: the job would end FAILED)."""
    from air.airnoded.steps import StepRunner
    from air.protos import air_pb2 as pb
    root = tmp_path / "cg"
    root.mkdir()
    groups = JobCgroups("n1", root=root, mode="v1", spool=tmp_path / "spool")
    batches: set = set()
    runner = StepRunner("n1", "127.0.0.1", groups, batch_here=lambda job_id, run: (job_id, run) in batches)
    folder = tmp_path / "job9.0"
    folder.mkdir()
    step = pb.Step(job_id=9, run=0, nodes=[pb.StepNode(node="n1", memory_limit_bytes=64 << 20)])
    batches.add((9, 0))   # being started: no shepherd tag, no record yet
    group = runner.run_group(step, 0, folder)
    assert group == groups.run_path(9, 0) and group.is_dir() and (9, 0) not in runner._own_groups
    runner._end_group((9, 0))
    assert group.is_dir()
    # the other order: the step made the run's group first, then the script started in it
    batches.clear()
    other = tmp_path / "job10.0"
    other.mkdir()
    own = runner.run_group(pb.Step(job_id=10, run=0, nodes=[pb.StepNode(node="n1")]), 0, other)
    assert (10, 0) in runner._own_groups
    batches.add((10, 0))
    runner._end_group((10, 0))
    assert own.is_dir() and (10, 0) not in runner._own_groups   # left to the script's launcher


@pytest.mark.skipif(MODE == "none", reason="no writable cgroup hierarchy on this host (checked by the test above)")
def test_a_script_that_starts_after_a_step_of_its_run_keeps_the_steps_folder_and_takes_its_group(nobody_dirs):
    """The other order, on a real cgroup tree: a step of the run reached the batch node first (its
    folder, its own group). The launcher keeps the folder (the step's records stay), starts the script
    in the same group and claims it: the step's end no longer empties it, and the script runs on."""
    import time
    from air.airnoded import jobfiles
    from air.airnoded.launcher import Launcher
    from air.airnoded.steps import StepRunner
    from air.protos import air_pb2 as pb
    work, spool, nobody = nobody_dirs.work, nobody_dirs.spool, nobody_dirs.nobody
    groups = JobCgroups("n1", spool=spool)
    exits = []
    launcher = Launcher("n1", spool, exits.append, groups)
    runner = StepRunner("n1", "127.0.0.1", groups, spool, batch_here=launcher.has_run)
    launcher.steps_here, launcher.group_lock = runner.has_ranks, runner.group_lock   # (as the agent wires them)
    launcher.claim_group = lambda job_id, run, group: runner.forget_group(job_id, run, group)
    folder = jobfiles.ensure_job_dir(spool, 11, 0)
    jobfiles.write_root_file(folder, "s0.pb", b"the step's record", 0o600)
    own = runner.run_group(pb.Step(job_id=11, run=0, nodes=[pb.StepNode(node="n1")]), 0, folder)
    assert runner._own_groups.get((11, 0)) == own
    try:
        launcher.launch(pb.Job(job_id=11, uid=nobody.pw_uid, gid=nobody.pw_gid, restart_count=0,
                               request=pb.JobRequest(script="#!/bin/sh\necho up\nsleep 30\n", workdir=str(work),
                                                     output="out"),
                               allocation=[pb.NodeAlloc(node="n1")]))
        wait_for(lambda: (work / "out").exists() and "up" in (work / "out").read_text(), timeout=30, what="the script")
        assert (folder / "s0.pb").read_bytes() == b"the step's record"   # the step's folder was kept
        assert (11, 0) not in runner._own_groups and groups.run_path(11, 0) == own   # the script's group now
        pid = launcher.jobs[(11, 0)].pgid
        assert str(pid) in (own / "cgroup.procs").read_text().split()
        runner._end_group((11, 0))   # the step's end
        time.sleep(0.3)
        assert not _gone(pid) and not exits   # the script runs on
    finally:
        launcher.signal(11, 0, 0, 1.0)
        wait_for(lambda: exits, timeout=30, what="the script's end")
        groups.close()


@pytest.fixture
def nobody_dirs():
    """A folder under /tmp that the user nobody can reach, with work/ (nobody's: a job's working
    directory) and spool/; removed after the test."""
    import pwd
    import shutil
    import tempfile
    from types import SimpleNamespace
    top = Path(tempfile.mkdtemp(prefix="air-test-cg-", dir="/tmp"))   # (nobody must reach its workdir)
    os.chmod(top, 0o755)
    work, spool = top / "work", top / "spool"
    work.mkdir()
    spool.mkdir(mode=0o755)
    nobody = pwd.getpwnam("nobody")
    os.chown(work, nobody.pw_uid, nobody.pw_gid)
    yield SimpleNamespace(top=top, work=work, spool=spool, nobody=nobody)
    shutil.rmtree(top, ignore_errors=True)


def _gone(pid: int) -> bool:
    """The process has ended (reaped or a zombie), also when it ends while we look."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pids_writable() -> bool:
    root = Path("/sys/fs/cgroup")
    if os.geteuid() != 0 or MODE == "none":
        return False
    if MODE == "v2":
        return "pids" in (root / "cgroup.controllers").read_text().split()
    return (root / "pids" / "cgroup.procs").exists()


@pytest.mark.skipif(not _pids_writable(), reason="no writable pids cgroup controller on this host")
def test_a_fork_bomb_stays_within_its_runs_task_bound(nobody_dirs):
    # a job (as nobody) forks 60 sleeps under a bound of 20 tasks: its forks fail beyond the bound, and
    # the node's other processes (the daemon's threads and shepherds) never feel it
    from air.airnoded import cgroups
    from air.airnoded.launcher import Launcher
    from air.protos import air_pb2 as pb
    work, spool, nobody = nobody_dirs.work, nobody_dirs.spool, nobody_dirs.nobody
    groups = JobCgroups("n1", spool=spool, pids_max=20)
    exits = []
    launcher = Launcher("n1", spool, exits.append, groups)
    script = (f"#!/bin/sh\nexec {sys.executable} -c '\nimport os, time\nmade = failed = 0\n"
              "for _ in range(60):\n    try:\n        pid = os.fork()\n    except OSError:\n        failed += 1\n"
              "        continue\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    made += 1\n"
              "print(\"forked\", made, \"failed\", failed, flush=True)\ntime.sleep(30)\n'\n")
    try:
        launcher.launch(pb.Job(job_id=9, uid=nobody.pw_uid, gid=nobody.pw_gid, restart_count=0,
                               request=pb.JobRequest(script=script, workdir=str(work), output="out"),
                               allocation=[pb.NodeAlloc(node="n1")]))
        out = work / "out"
        wait_for(lambda: out.exists() and "forked" in out.read_text(), timeout=30, what="the job's forks")
        memory = groups.run_path(9, 0)
        where = cgroups.joined(memory)[-1]   # the group that holds the bound (v1: the pids hierarchy's)
        assert (where / "pids.max").read_text().strip() == "20"
        assert 0 < int((where / "pids.current").read_text()) <= 20
        assert len(groups.pids(memory)) <= 20
        made, failed = (int(w) for w in out.read_text().split()[1::2][:2])
        assert made + failed == 60 and made <= 19 and failed >= 41   # (itself and at most 19 children)
        launcher.signal(9, 0, 0, 1.0)
        wait_for(lambda: exits, timeout=30, what="the job's end")
        wait_for(lambda: not any(g.exists() for g in cgroups.joined(memory)), timeout=10,
                 what="the run's groups to be removed")
    finally:
        for g in cgroups.joined(groups.run_path(9, 0)):
            groups.empty(g) if g.exists() else None
        groups.remove(groups.run_path(9, 0))
        groups.close()


@pytest.mark.skipif(MODE != "v1" or not Path("/sys/fs/cgroup/devices/devices.deny").exists(),
                    reason="the devices controller of cgroup v1 (v2 needs eBPF, not done)")
def test_a_job_opens_only_its_own_gpus_device_files(nobody_dirs):
    # device files of four GPUs (NVIDIA's major); the job (as nobody) has GPUs 1 and 3 of the node and
    # unsets nothing: it tries to open all four. Its cgroup denies 0 and 2 (EPERM); 1 and 3 get past the
    # cgroup to the kernel (no driver here: ENXIO or ENODEV; on a GPU host they open)
    import stat
    from air.airnoded import cgroups
    from air.airnoded.launcher import Launcher
    from air.protos import air_pb2 as pb
    work, spool, nobody = nobody_dirs.work, nobody_dirs.spool, nobody_dirs.nobody
    dev = nobody_dirs.top / "dev"
    dev.mkdir(mode=0o755)
    for minor in range(4):
        os.mknod(dev / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(cgroups.NVIDIA_MAJOR, minor))
        os.chmod(dev / f"nvidia{minor}", 0o666)
    groups = JobCgroups("n1", spool=spool, gpu_minors={i: i for i in range(4)})
    exits = []
    launcher = Launcher("n1", spool, exits.append, groups)
    script = (f"#!/bin/sh\nexec {sys.executable} -c '\nimport errno, os\nfor i in range(4):\n    try:\n"
              f"        os.close(os.open(\"{dev}/nvidia%d\" % i, os.O_RDWR))\n        print(i, \"opened\")\n"
              "    except OSError as e:\n        print(i, errno.errorcode[e.errno])\n'\n")
    try:
        launcher.launch(pb.Job(job_id=9, uid=nobody.pw_uid, gid=nobody.pw_gid, restart_count=0,
                               request=pb.JobRequest(script=script, workdir=str(work), output="out"),
                               allocation=[pb.NodeAlloc(node="n1", gpus=[1, 3])]))
        wait_for(lambda: exits, timeout=30, what="the job's end")
        said = dict(line.split() for line in (work / "out").read_text().splitlines())
        assert said["0"] == "EPERM" and said["2"] == "EPERM", said
        assert said["1"] != "EPERM" and said["3"] != "EPERM", said
        wait_for(lambda: not any(g.exists() for g in cgroups.joined(groups.run_path(9, 0))), timeout=10,
                 what="the run's groups to be removed")
        assert not (Path("/sys/fs/cgroup/devices") / groups.run_path(9, 0).relative_to(
            Path("/sys/fs/cgroup/memory"))).exists()
    finally:
        groups.remove(groups.run_path(9, 0))
        groups.close()


@pytest.mark.skipif(MODE == "none", reason="no writable cgroup hierarchy on this host (checked by the test above)")
def test_a_batch_runs_group_is_found_from_its_shepherds_record(tmp_path, shepherd_kind):
    """The launcher leaves the run's group for its shepherd to record (its record's second line, before
    anything joins it): the fence keeper finds there what to kill, processes that left the job's
    process group included, and a daemon that adopts the run finds its group."""
    from air.airnoded import fence, shepherding
    from air.airnoded.shepherding import Child
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    groups = JobCgroups("recorded-n1", spool=spool)
    folder = spool / "job9.0"
    folder.mkdir(mode=0o711)
    group = groups.create(9, 0, 0)
    try:
        r, w = os.pipe()
        herd = shepherding.spawn(folder, "batch", [Child(["/bin/sh", "-c", "setsid sleep 60 & wait"], {}, w, w)],
                                 None, os.getgid(), [os.getgid()], group, named=False)
        os.close(w)
        os.close(r)
        assert not (folder / fence.CGROUP).exists() and fence.recorded_cgroup(folder) == group
        wait_for(lambda: len(fence._cgroup_pids(folder)) == 2, timeout=10, what="the shell and its escaped sleep")
        assert fence.stop_runs(spool, signal.SIGKILL) == ["job9.0"]
        wait_for(lambda: not groups.pids(group), timeout=10, what="the group to empty")
        herd.wait()
    finally:
        groups.kill(group)
        groups.remove(group)
        groups.close()
