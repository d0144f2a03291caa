"""How airrun knows a node daemon is still there while a step's stream is quiet.

A step can print nothing for hours. A node daemon that is frozen, or a host cut off, then fails
nothing: TCP sends nothing on an idle connection, and gRPC's own pings on a stream that carries no
data are throttled to one a minute. So airrun asks for beats (RunStepRequest.beats), and the node
daemon sends one (a StepEvent with only `beat` set) when the stream starts and after each BEAT_S
without other events. airrun, once a call has had a beat, counts the node as lost after SILENCE_S
without any message on it, and gives it up after its patience more (see aircli/run.py); it never
cancels the call for that (the daemon would kill the ranks of a step that is only slow). A daemon
from before beats sends none, and airrun waits on its streams as it did; an airrun from before
them asks for none, and gets none."""
from __future__ import annotations

BEAT_S = 2.0
SILENCE_S = 4 * BEAT_S

# airrun's channels to the node daemons
CLIENT_OPTIONS = (
    # a daemon that is back within seconds after a restart: retry often, not after backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
