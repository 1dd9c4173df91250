"""Load generators and benchmarks: commands that print figures, never pass/fail tests."""
