"""A real munged for tests: its own key, socket and files in a temporary folder."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path


class Munged:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="air-munge-"))
        os.chmod(self.dir, 0o755)
        self.key = self.dir / "munge.key"
        self.key.write_bytes(os.urandom(1024))
        os.chmod(self.key, 0o400)
        self.socket = str(self.dir / "munge.socket")

    def start(self) -> "Munged":
        munged = shutil.which("munged") or "/usr/sbin/munged"
        subprocess.run([munged, "--force", f"--socket={self.socket}", f"--key-file={self.key}",
                        f"--log-file={self.dir / 'munged.log'}", f"--pid-file={self.dir / 'munged.pid'}",
                        f"--seed-file={self.dir / 'munged.seed'}"], check=True, capture_output=True)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline:
                raise AssertionError(f"munged did not create {self.socket}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        try:
            os.kill(int((self.dir / "munged.pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


TEST_USERS = ("airtest-a", "airtest-b", "airtest-op")


def started_for_test_users():
    """A started munged, once the test users scripts/test.sh creates exist (for module fixtures)."""
    missing = [u for u in TEST_USERS if not _user_exists(u)]
    assert not missing, f"test users {missing} are missing: scripts/test.sh creates them (useradd)"
    return Munged().start()


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False
