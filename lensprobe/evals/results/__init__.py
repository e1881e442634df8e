"""Results and verdicts: result folders and their rows, the checks on them, what a run ran, statistics, the verdict columns and the papers' published numbers."""
