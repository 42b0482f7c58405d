"""The terminal: logs, progress bars and one-line errors and warnings on stderr; verdicts and tables on stdout.

It prints what other layers hand it and never decides anything: what a line says is the caller's.
"""
