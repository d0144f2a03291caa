"""A step's events on their way to airrun: a FIFO bounded in events and in bytes of output, read by
one gRPC thread, that can be handed over whole when the daemon stops.

Everything is under one lock, so a hand-over and the reader never both take events: the reader
has taken, in order, everything before what the hand-over gets, and nothing after it."""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable


QUIET = object()   # Outbox.get: nothing within its timeout


class Outbox:
    def __init__(self, max_events: int, max_bytes: int):
        self.max_events, self.max_bytes = max_events, max_bytes
        self._items: deque = deque()
        self._bytes = 0
        self._closed = False
        self._cv = threading.Condition()

    def put(self, event, give_up: Callable[[], bool]) -> bool:
        """Add an event, waiting while the box is full; False, and nothing added, once it is closed or
        when `give_up()` says so (asked every 0.2 s while waiting)."""
        size = len(event.data)
        with self._cv:
            while self._items and (len(self._items) >= self.max_events or self._bytes + size > self.max_bytes):
                if self._closed or give_up():
                    return False
                self._cv.wait(0.2)
            if self._closed:
                return False
            self._items.append(event)
            self._bytes += size
            self._cv.notify_all()
            return True

    def get(self, timeout: float | None = None):
        """The next event; None once the box is closed and what it held is taken (or handed over);
        QUIET when `timeout` passed without one."""
        with self._cv:
            while not self._items:
                if self._closed:
                    return None
                if not self._cv.wait(timeout) and timeout is not None and not self._items and not self._closed:
                    return QUIET
            event = self._items.popleft()
            self._bytes -= len(event.data)
            self._cv.notify_all()
            return event

    def close(self) -> None:
        """No more events: the reader ends after those held."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def hand_over(self) -> list:
        """Close the box and take what it holds: the reader ends at once."""
        with self._cv:
            items = list(self._items)
            self._items.clear()
            self._bytes = 0
            self._closed = True
            self._cv.notify_all()
            return items

    def empty(self) -> bool:
        with self._cv:
            return not self._items
