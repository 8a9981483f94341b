"""What every process runs on: settings, the loop supervisor, logging, metric definitions."""
