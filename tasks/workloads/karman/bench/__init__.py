"""karman's bench measurements: its part of bench-quality (rollouts scored, the surrogate's step against the solver's)."""
