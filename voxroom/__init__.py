"""voxroom: a multi-room realtime voice server.

Layout: ``voxroom`` holds what every process shares (wire protocol, Redis key names, settings,
errors, the voice catalog, audio framing); ``app`` is the WebSocket gateway; ``workers`` is the
synthesis pool and its engines.
"""

__version__ = "0.1.0"
