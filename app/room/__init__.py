"""The room WebSocket: admission, the socket's frames, its outbound queue, who it speaks as."""
