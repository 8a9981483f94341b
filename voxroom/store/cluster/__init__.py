"""The Redis Cluster implementation of the store."""
