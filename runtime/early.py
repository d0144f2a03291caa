"""Installed before anything heavy is imported: a SIGTERM that arrives while torch is still loading
(a preemption or a time-limit warning right after the job started) is remembered, not fatal, and
StopSignal picks it up once the runtime is initialised."""
import signal
import threading

received = threading.Event()


def _remember(signum, frame) -> None:
    received.set()


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _remember)
