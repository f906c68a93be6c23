"""The on-disk format of a run: the only reader and writer of results.csv, samples.csv and meta.json, and the
lock that keeps one writer per folder."""
