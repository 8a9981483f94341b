"""The worker process's intake: jobs from the store into the context pool, kept claimed."""
