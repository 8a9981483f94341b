"""A line's audio into its room: slices, presentation times, pacing, Opus."""
