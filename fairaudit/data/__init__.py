"""Dataset loaders, prose templates, counterfactual pairs and MCQ permutations."""
