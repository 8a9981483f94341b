"""The gateway: WebSocket rooms in, Redis Streams between, audio out to every client of a room."""
