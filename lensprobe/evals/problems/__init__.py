"""Problem sets: MATH-500 (the copy lensprobe ships), problem files (JSONL, Parquet), the hub, generated arithmetic problems, and which benchmark a set is."""
