"""Guard evaluation's parts (`tools.research.guard_eval` evaluates): the values, records and code-name
tables a guard is evaluated with (`terms`), and the evaluator of one expression (`evaluator`)."""
