"""story_writer: a story agent over a growing manuscript (data/: outline, characters, chapters)."""
