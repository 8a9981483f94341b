"""The audio cache: a repeated line published from Redis instead of synthesized again."""
