"""A clock in the test's hands, for a controller built in-process (no daemons)."""


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now
