"""`python -m fairaudit.report`: turn a set of MLflow runs into a study's tables and figures.

runs.py selects and reads runs (MLflow I/O), build.py decides what the selection supports
(paper tables with a pooled row, seed summaries, sign test, checkpoint curves) from the pure
functions of fairaudit.analysis.study, render.py formats, app.py writes, prints and logs.
"""
