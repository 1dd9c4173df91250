"""The shared runtime of every pipeline: consuming in batches, exactly-once checkpoints, dead letters, topics."""
