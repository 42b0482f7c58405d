"""Arms: chat messages, pre-fills, force-answer suffixes and answer parsing."""
