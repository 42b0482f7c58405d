"""MLflow tracking: one run per job and a parent run per sweep, with every tag, param, metric, table, figure, record
frame and per-sample page a run needs to be compared and repeated; the local tracking database; where to see a run.

It logs what it is handed (a probe's result, a sweep's children) and never computes a metric, reads the job's
config or asks a model. Every tag name it writes is in `tags`.
"""
