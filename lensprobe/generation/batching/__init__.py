"""How a generation's rows are batched: the left-padded layout, each row's state, the scheduler of continuous batching and the KV cache's rows."""
