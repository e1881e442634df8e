"""Generation traces: the trace object, its file format, tracked token sets, trace sets over many prompts and a figure's summary of them."""
