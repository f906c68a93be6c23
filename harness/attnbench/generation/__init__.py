"""The real decoder generating with each method: tasks built offline (passkey, needles, a user's JSONL), the prompt
prefilled once exactly and shared, each method's state per layer (its `prefill`, or its state built from the exact
prompt), every later token through its `step`, greedy; scored as RULER scores (the reference string in the answer)
and by continuation quality (teacher-forced perplexity against the exact model's)."""
