"""The HTTP API: speech, voices, metrics, CORS."""
