"""The wire protocol and the room's output entries, sans I/O: bytes in, typed messages out."""
