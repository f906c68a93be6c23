"""Where Q/K/V come from: seeded synthetic distributions, the captured-file format, and the catalogue that names
them, validates their parameters and draws one cell's inputs."""
