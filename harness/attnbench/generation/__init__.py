"""The real decoder generating with each method: tasks built offline (RULER's synthetic mix, passkey, a continuation,
a user's JSONL), the prompt prefilled once exactly and shared, each method's state per layer (its `prefill`, or its
state built from the exact prompt), every later token under one budget rule (kvpress's by default: compressed once,
then appended), greedy; scored as RULER scores (string_match_all / _part) and by continuation quality (teacher-forced
perplexity against the exact model's)."""
