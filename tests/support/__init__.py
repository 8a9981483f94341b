"""Shared test support: real processes (redis-server, gateways, workers) and a room client."""
