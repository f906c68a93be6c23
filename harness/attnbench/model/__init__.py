"""The Hugging Face wing: variants swapped into a real model's attention (`attnbench model`), Q/K/V captured
from a model for the `captured` input (`attnbench capture`), and the model study's report."""
