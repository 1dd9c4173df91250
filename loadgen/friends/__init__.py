"""friends_who_like on the typical mix and the heavy tail (`python -m loadgen.friends`)."""
