"""The test clusters' loopback blocks: one holder at a time, across processes too (two test runs at
once, or CI beside a developer, never share an address)."""
import subprocess
import sys
from pathlib import Path

from cluster import Block

HERE = Path(__file__).resolve().parent
TAKE = "import sys; sys.path.insert(0, sys.argv[1]); from cluster import Block; print(Block().prefix)"


def _taken_elsewhere() -> str:
    """The block another process gets (released when it exits)."""
    return subprocess.run([sys.executable, "-c", TAKE, str(HERE)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_block_is_held_by_one_cluster_at_a_time_across_processes():
    first, second = Block(), Block()
    try:
        assert first.prefix != second.prefix and first.prefix.startswith("127.0.")
        assert _taken_elsewhere() not in (first.prefix, second.prefix)
    finally:
        first.release()
        second.release()
    third = Block()     # a released block is free again: the same process's next one starts where the first did
    try:
        assert third.prefix == first.prefix
    finally:
        third.release()
