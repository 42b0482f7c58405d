"""The result store and its client: every model call answered from the store first, and kept there as it comes.

`results.Store` is the content-addressed table of results (sqlite or PostgreSQL; keys, checksums, commits);
`client.CachingClient` wraps any backend with it, so a re-run or a killed run computes nothing twice;
`cli` is `fairaudit store` (verify, export, import). Never any model arithmetic, MLflow or analysis.
"""

from fairaudit.store.results import Store

__all__ = ["Store"]
