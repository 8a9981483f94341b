"""Lines in: a ``say`` checked, stored and handed to the workers."""
