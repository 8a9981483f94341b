"""The synthesis side: a per-device context pool fed from Redis, and the engines it drives."""
