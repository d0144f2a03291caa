"""airctld: the controller daemon. Owns the job queue and all durable cluster state."""
