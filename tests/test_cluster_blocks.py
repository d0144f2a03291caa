"""The test clusters' loopback blocks: one holder at a time, across processes too (two test runs at
once, or CI beside a developer, never share an address), and free again once let go."""
import subprocess
import sys
from pathlib import Path

from cluster import Block

HERE = Path(__file__).resolve().parent
TAKE = ("import sys; sys.path.insert(0, sys.argv[1]); from cluster import Block; "
        "print(Block(start=int(sys.argv[2])).prefix)")


def _taken_elsewhere(start: int) -> str:
    """The block another process gets when it starts looking where `start` says (let go as it exits)."""
    return subprocess.run([sys.executable, "-c", TAKE, str(HERE), str(start)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_block_is_held_by_one_cluster_at_a_time_across_processes():
    first = Block()
    second = Block(start=first.index)   # looks where the first did: must pass it by
    try:
        assert first.prefix != second.prefix and first.prefix.startswith("127.0.")
        assert _taken_elsewhere(first.index) not in (first.prefix, second.prefix)
        held = first.prefix
    finally:
        first.release()
        second.release()
    again = Block(start=first.index)    # let go: free again
    try:
        assert again.prefix == held
    finally:
        again.release()
