"""Likes and follows: the pipeline beside the seed's approach and the ceilings (`python -m loadgen.social`)."""
