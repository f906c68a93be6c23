"""An example attnbench plugin (see the README's "Adding a variant")."""
