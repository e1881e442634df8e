"""What runs a generation step: the TransformerBridge with its hook points, or a plain view of
its Hugging Face model (same tensors, no hook points) with an attention kernel that also
returns the newest query's weights, TransformerLens hook names served on it, and a thread
rule for small decode steps.

May import: :mod:`lensprobe.core`.
"""
