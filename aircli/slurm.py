"""Slurm's command names as thin front ends over AIR's own tools, for the scripts and programs that
call them (sbatch, squeue, sacct, ...). They are never on anyone's PATH by default, so that a site
that also runs Slurm keeps it: an admin writes them into a folder of their choice with
`aircontrol slurm-commands install --dir DIR` (docs/slurm.md).

Each front end is the AIR tool itself under Slurm's name: the same options (those AIR's tools take
are Slurm's), the same output, and errors that name the Slurm command."""
from __future__ import annotations

import importlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from air.aircli.client import CliError, run

# Slurm's name -> the AIR tool's module (its click command is `command`)
FRONT_ENDS = {
    "sbatch": "air.aircli.batch",
    "srun": "air.aircli.run",
    "squeue": "air.aircli.queue",
    "scancel": "air.aircli.cancel",
    "sinfo": "air.aircli.info",
    "sacct": "air.aircli.acct",
    "scontrol": "air.aircli.control",
}
MARK = "# A Slurm command name for AIR, written by: aircontrol slurm-commands install"


def main(name: str) -> None:
    """The entry of an installed front end (through the tool's own `start` where it has one)."""
    module = importlib.import_module(FRONT_ENDS[name])
    start = getattr(module, "start", None)
    sys.exit(start(name, sys.argv[1:]) if start else run(module.command, name))


def _ours(path: Path) -> bool:
    """A regular file this installer wrote (read as the installer, never through a link, never
    blocking on a FIFO put there meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return MARK.encode() in os.read(fd, 4096)
    except OSError:
        return False
    finally:
        os.close(fd)


def _unsafe_folder(directory: Path) -> str:
    """Why commands root may run must not go in this folder, or "" (others could replace them)."""
    st = os.stat(directory)
    if st.st_uid not in (0, os.geteuid()):
        return f"{directory} belongs to uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{directory} is writable by its group or by others"
    return ""


def install(directory: Path, force: bool = False, python: str = sys.executable) -> list[Path]:
    """Write every front end into `directory`; refuses, changing nothing, where a file of that name
    is there and is not one of ours (Slurm's own sbatch, say) unless forced."""
    if not directory.is_dir():
        raise CliError(f"{directory} is not a directory")
    unsafe = _unsafe_folder(directory)
    if unsafe and not force:
        raise CliError(f"{unsafe}: anyone who can write there could replace the commands; nothing was written; "
                       "give --force to write there anyway")
    foreign = [directory / n for n in FRONT_ENDS
               if os.path.lexists(directory / n) and not _ours(directory / n)]
    if foreign and not force:
        raise CliError(f"{', '.join(map(str, foreign))} exist and are not AIR's (Slurm's own commands?); "
                       "nothing was written; give --force to replace them")
    written = []
    for name, module in FRONT_ENDS.items():
        text = f"#!{python}\n{MARK}\nfrom air.aircli.slurm import main\nmain({name!r})\n"
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            os.fchmod(fd, 0o755)   # through the descriptor: the name could be swapped for a link meanwhile
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, directory / name)
        except BaseException:
            os.unlink(tmp)
            raise
        written.append(directory / name)
    return written


def uninstall(directory: Path) -> list[Path]:
    """Remove the front ends this installer wrote, and nothing else."""
    removed = []
    for name in FRONT_ENDS:
        path = directory / name
        if _ours(path):
            path.unlink()
            removed.append(path)
    return removed
