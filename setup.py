"""The package's one compiled part: the shepherd program (airnoded/shepherd.c), built into the package
as air/airnoded/air-shepherd. Where no C compiler is found the package installs without it and the
node daemon starts shepherd.py instead (slower: a Python process for every run)."""
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

SOURCE = Path("airnoded") / "shepherd.c"


class BuildWithShepherd(build_py):
    def _target(self) -> Path:
        return Path(self.build_lib) / "air" / "airnoded" / "air-shepherd"

    def run(self):
        super().run()
        target = self._target()
        target.unlink(missing_ok=True)   # (never an earlier build's, should this one fail)
        compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        # static where the C library allows it: an exec then skips the dynamic loader (a shepherd a run)
        for link in (["-static"], []):
            command = [*compiler, "-O2", "-Wall", *link, "-o", str(target), str(SOURCE)]
            try:
                done = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:
                done = subprocess.CompletedProcess(command, 1, "", str(e))
            if done.returncode == 0:
                break
        if done.returncode != 0:
            print(f"air: the shepherd program was not built ({(done.stderr or '').strip()[-300:]}); "
                  "airnoded will start shepherd.py instead")
            return
        target.chmod(0o755)

    def get_outputs(self, include_bytecode=True):
        target = self._target()
        return super().get_outputs(include_bytecode) + ([str(target)] if target.exists() else [])


class PlatformDistribution(Distribution):
    def has_ext_modules(self):   # a compiled program inside: the wheel is for this platform
        return True


setup(cmdclass={"build_py": BuildWithShepherd}, distclass=PlatformDistribution)
