"""From rows to what a person reads: text and frame helpers, the analysis (slopes, crossovers, efficiency), the
verdict (the one dominance rule), the summary, the document model and its Markdown/HTML renderers, plots, and
`compare` of two runs. Reads run folders; never measures."""
