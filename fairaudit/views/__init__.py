"""How a probe's results read: its sections of `fairaudit report` (`sections`, `render`: numbers formatted as the
papers print them, `selection`: which runs a section shows) and its sample-page layout (`pages`). Pure: frames and
strings in and out; it never prints, writes a file or reads MLflow.
"""
