"""The ``voxroom`` command: the composition root that starts gateways, workers and their Redis."""
