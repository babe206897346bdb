"""What devices can do and what a run used of them: FLOP ceilings, timed matmuls and steps, energy and utilisation."""
