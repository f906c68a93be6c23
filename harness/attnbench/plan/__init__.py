"""What a run will do, before any work: the axes of a sweep declared once (cells, comparison groups, keys), its
settings, and the TOML config with every problem reported up front. No torch."""
