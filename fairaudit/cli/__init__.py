"""The `fairaudit` command line: subcommands (`list`, `data`, `store`, `report`), overrides checked before Hydra
sees them (a misspelt name is one line naming the nearest), shell completion. Anything else is a Hydra audit run.
It parses and dispatches; it never holds model, data or analysis logic.
"""
