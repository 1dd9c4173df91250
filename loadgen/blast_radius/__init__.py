"""Blast radius: poison and a broken view in one stream of ten; how the others fare (run by hand)."""
