"""The single-instance implementation of the store: one Redis (or a primary with replicas)."""
