"""Likes per second as the state grows to 20 M likes (`python -m loadgen.likes_at_size`)."""
