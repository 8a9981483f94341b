"""Redis: one interface for the layers above, one implementation per Redis mode."""
