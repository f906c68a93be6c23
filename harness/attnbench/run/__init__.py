"""Orchestration: budgets and skips, resume, the executors (in-process, isolated worker, several processes,
Ray) and the wire format a worker speaks. Hands groups to `attnbench.measure`, rows to `attnbench.runfolder`."""
