"""Voices and what they say: the catalog, mixes, languages, the narrator's markup, lexicons."""
