"""The store as a file: an online backup under a submission storm restores into a controller that shows
every job acknowledged before the backup began (and no job never acknowledged); a damaged store is
refused at start with one line, and `aircontrol store check` says what is wrong."""
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

from air.airctld.model import Job
from air.airctld.store import Store
from cluster import BIN, wait_for
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase



def _cli(*args, env=None, timeout=60):
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_backup_under_a_submission_storm_restores_every_acknowledged_job(cluster):
    script = cluster.write_script("held.sh", "#!/bin/sh\ntrue\n")
    acked: list[tuple[int, float]] = []
    stop = threading.Event()
    errors: list[str] = []

    def storm():
        while not stop.is_set():
            proc = cluster.cli("airbatch", "--parsable", "-H", "--job-name", "storm", str(script), check=False)
            if proc.returncode != 0:
                errors.append(proc.stderr)
                return
            acked.append((int(proc.stdout.strip()), time.monotonic()))

    threads = [threading.Thread(target=storm) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 30 or errors, timeout=60, what="30 acknowledged submissions")
        began = time.monotonic()
        backup = cluster.root / "backups"
        backup.mkdir()
        made = cluster.cli("aircontrol", "store", "backup", str(backup))
        count_at_end = len(acked)
        wait_for(lambda: len(acked) >= count_at_end + 10 or errors, timeout=60, what="submissions after the backup")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    copies = list(backup.iterdir())
    assert len(copies) == 1 and copies[0].name.startswith("air-") and copies[0].suffix == ".db", copies
    assert copies[0].stat().st_mode & 0o077 == 0, "a backup holds scripts and environments: owner only"
    assert "integrity ok" in made.stdout, made.stdout
    before = {job_id for job_id, at in acked if at < began}
    everything = {job_id for job_id, _ in acked}

    # the restore of docs/deploy.md: the controller dies, the backup takes the store's place
    refused = cluster.cli("aircontrol", "store", "restore", str(copies[0]), check=False)
    assert refused.returncode == 1 and "an airctld runs on" in refused.stderr, refused.stderr
    cluster.kill_controller()
    restored_line = cluster.cli("aircontrol", "store", "restore", str(copies[0])).stdout
    assert f"new jobs get ids from {max(everything) + 1}" in restored_line, restored_line
    aside, = (cluster.dir / "state").glob("air.db.replaced-*")
    kept = sqlite3.connect(aside)   # with the commits the killed controller left in its log
    try:
        kept_ids = {r for (r,) in kept.execute("SELECT id FROM jobs WHERE name = 'storm'")}
    finally:
        kept.close()
    assert set(everything) <= kept_ids, "the replaced store lost acknowledged jobs"
    checked = cluster.cli("aircontrol", "store", "check")
    assert "integrity ok" in checked.stdout and "schema" in checked.stdout, checked.stdout
    cluster.start_controller()
    restored = {j["job_id"] for j in cluster.queue("-t", "all") if j["name"] == "storm"}
    assert before <= restored, f"acknowledged before the backup but missing: {sorted(before - restored)[:10]}"
    assert restored <= everything, f"never acknowledged: {sorted(restored - everything)[:10]}"
    assert len(restored) < len(everything), "the backup holds submissions made after it ended"
    # the restored controller takes new work, and never gives out an id it gave before: not even one
    # the backup never saw (such a job may still run somewhere)
    new_id = cluster.submit(script, "-H")
    assert new_id > max(everything)
    # one controller to a store
    second = subprocess.run([sys.executable, "-m", "air.airctld", "--config", str(cluster.config)], capture_output=True,
                            text=True, timeout=30)
    assert second.returncode == 2 and "an airctld runs on" in second.stderr, second.stderr[-500:]


def test_a_restore_is_refused_a_newer_schema_and_a_killed_one_is_never_an_empty_store(tmp_path):
    from air.airctld.store import SCHEMA_VERSION
    newer = tmp_path / "newer.db"
    store = Store(str(newer))
    store.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store.close()
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "air.toml"
    config.write_text(f'[controller]\naddress = "127.0.60.210:6817"\nstate_dir = "{state}"\nauth = "none"\n'
                      '[[nodes]]\nname = "n1"\naddress = "127.0.60.211"\n'
                      '[[partitions]]\nname = "p"\nnodes = "n1"\n')
    proc = _cli("aircontrol", "store", "restore", str(newer), "--config", str(config))
    assert proc.returncode == 1 and f"schema {SCHEMA_VERSION + 1}, newer" in proc.stderr, proc.stderr
    assert not (state / "air.db").exists()
    # a restore killed after the store was set aside and before the new one took its place
    (state / "air.db.replaced-20261126T000000Z").write_bytes(b"")
    proc = _cli("airctld", "--config", str(config), timeout=30)
    assert proc.returncode == 2 and "restore that did not finish" in proc.stderr, proc.stderr[-500:]
    assert not (state / "air.db").exists(), "a new, empty store where one was"


def _damaged_copy(tmp_path, source: str):
    """A copy of a store with jobs in it, pages in the middle of its file overwritten."""
    path = tmp_path / "state" / "air.db"
    path.parent.mkdir()
    shutil.copy(source, path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for page in range(size // 4096 // 3, size // 4096 * 2 // 3):
            f.seek(page * 4096)
            f.write(b"\xa5" * 4096)
    return path


def test_a_damaged_store_is_refused_at_start_with_one_line(tmp_path):
    sound = tmp_path / "sound.db"
    store = Store(str(sound))
    with store.transaction():
        for i in range(400):
            store.insert_job(Job(job_id=0, uid=1000, gid=1000, user="u", name=f"j{i}", partition="p",
                                 num_nodes=1, gpus_per_node=1, cpus_per_node=1, time_limit_s=60,
                                 submit_time=1.0, priority=1, phase=JobPhase.PENDING,
                                 request=pb.JobRequest(script="#!/bin/sh\n" + "x" * 500)), 0)
    store.close()
    path = _damaged_copy(tmp_path, str(sound))
    config = tmp_path / "air.toml"
    config.write_text(f'[controller]\naddress = "127.0.60.200:6817"\nstate_dir = "{path.parent}"\nauth = "none"\n'
                      '[[nodes]]\nname = "n1"\naddress = "127.0.60.201"\n'
                      '[[partitions]]\nname = "p"\nnodes = "n1"\n')
    before = path.read_bytes()
    proc = _cli("airctld", "--config", str(config), timeout=30)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "damaged" in errors[0] and "backup" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert path.read_bytes() == before, "a refused start changed the store"
    check = _cli("aircontrol", "store", "check", "--config", str(config))
    assert check.returncode == 1 and "DAMAGED" in check.stderr, (check.returncode, check.stdout, check.stderr)
    # the sound original passes the same check
    shutil.copy(sound, path)
    check = _cli("aircontrol", "store", "check", "--config", str(config))
    assert check.returncode == 0 and "integrity ok" in check.stdout and "400 jobs (400 not ended)" in check.stdout, \
        (check.stdout, check.stderr)
    # a backup of a damaged store leaves nothing behind
    (tmp_path / "again").mkdir()
    shutil.copy(_damaged_copy(tmp_path / "again", str(sound)), path)
    out = tmp_path / "copy.db"
    proc = _cli("aircontrol", "store", "backup", str(out), "--config", str(config))
    assert proc.returncode == 1 and not out.exists() and not list(tmp_path.glob(".copy.db*")), \
        (proc.returncode, proc.stdout, proc.stderr)
