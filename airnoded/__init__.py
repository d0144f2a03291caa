"""airnoded: the node daemon. Owns one host: its GPUs and the processes of the jobs placed on it."""
