"""Data sets: loaders, prose templates, counterfactual pairs and MCQ permutations, their files, checksums, sources
and downloads (`fairaudit data fetch`, `check`). It never calls a model or renders a chat prompt."""
