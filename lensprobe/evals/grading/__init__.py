"""Reading and grading answers: extraction (the last ``\\boxed{...}``, the last number), the graders (math-verify, the MATH paper's string grader, the authors' own) and their bounds."""
