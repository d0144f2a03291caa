"""Installed before anything heavy is imported: a SIGTERM that arrives while torch is still loading
(a preemption or a time-limit warning right after the job started) is remembered, not fatal, and
StopSignal picks it up once the runtime is initialised."""
import atexit
import signal
import threading

received = threading.Event()


def _remember(signum, frame) -> None:
    received.set()


def _ignore_from_now_on() -> None:
    # The process is ending on its own: a stop signal now (a time-limit warning that crosses the
    # end of training) has nothing left to stop, and Python's teardown would let it kill the process.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _remember)
    atexit.register(_ignore_from_now_on)
