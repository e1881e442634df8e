"""What a run measures: metrics (pure functions of tensors) and measures (one value per batch row of a
forward over a prompt), with the one metric vocabulary (:data:`METRIC_NAMES`) every head study takes.

Example:
    >>> lp.metrics.entropy(torch.zeros(4))          # ln 4
    tensor(1.3863)
    >>> lp.metrics.measure_once(model, lp.metrics.NextTokenEntropy(), prompt)
"""

from lensprobe.core.boundary import guard_public
from lensprobe.core.measures.forced import METRIC_NAMES, ContinuationEntropy, ContinuationLogProb, LogitDiff
from lensprobe.core.measures.measure import AnswerLogProb, AttentionTo, NextTokenEntropy, measure_once
from lensprobe.core.measures.metrics import (
    DEFAULT_TOKEN_CLASSES,
    attention_by_token_class,
    attention_proportion,
    average_attention_received,
    entropy,
)

__all__ = ["DEFAULT_TOKEN_CLASSES", "METRIC_NAMES", "AnswerLogProb", "AttentionTo", "ContinuationEntropy",
           "ContinuationLogProb", "LogitDiff", "NextTokenEntropy", "attention_by_token_class", "attention_proportion",
           "average_attention_received", "entropy", "measure_once"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
