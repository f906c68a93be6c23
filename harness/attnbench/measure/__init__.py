"""One comparison group in, rows out: inputs and the exact reference once, self-checks, error, the variants timed
in turns, memory, noise and the machine's peaks. Torch, and no file I/O."""
