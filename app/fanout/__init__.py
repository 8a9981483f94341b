"""Room fan-out: each room's output entries to its clients, live or catching up."""
