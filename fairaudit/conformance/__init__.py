"""The backend contract checked on real forward passes: the checks every backend is held to (`checks`), and
`fairaudit check backend=NAME`, which builds a backend as its config's `conformance:` entry says and runs them
(`command`), so an installed outside backend is checked without a checkout. It never runs an audit or logs a run.
"""
