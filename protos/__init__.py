"""The wire contract between AIR's processes: generated gRPC code and the enums built from it."""
