"""`python -m loadgen.backfill`: a new view backfilled from retained page views, beside the live runner."""
