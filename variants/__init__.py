"""Built-in attention variants, one file per family; each is registered in pyproject.toml's
`attnbench.variants` entry-point group, the same group a plugin uses."""
