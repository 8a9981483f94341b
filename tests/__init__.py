"""voxroom tests: layers mirror the source tree (protocol, workers, app, e2e over real processes)."""
