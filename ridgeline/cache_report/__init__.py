"""`ridgeline cache-report FILE.jsonl`: how much a prefix cache would save on logged traffic, offline."""
