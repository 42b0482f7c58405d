"""`fairaudit report` (`python -m fairaudit.report`): turn a set of MLflow runs into a study's tables and figures.

runs.py selects and reads runs (MLflow I/O), build.py hands each probe's section builders their runs and adds what
the selection supports across probes (seed summaries, sign test, checkpoint curves, the family of tests, engine
sensitivity) from the pure functions of fairaudit.analysis, app.py writes, prints and logs; tables are formatted by
fairaudit.views. It never names a probe or holds one's tables: each probe's config lists its own sections.
"""
