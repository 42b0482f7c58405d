"""Arms: chat messages, pre-fills, force-answer suffixes and answer parsing. Strings and token ids only: it never
calls a model or reads a data file."""
