"""The verbs of the `attnbench` command, one module each: `add_parser(subparsers)` adds its sub-parser and help,
`main(args)` runs it and returns its exit status. `attnbench.cli` holds the top-level parser and the dispatch."""
