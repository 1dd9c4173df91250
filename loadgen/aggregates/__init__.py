"""Each aggregate's own cost per event in the engine, no Kafka (`python -m loadgen.aggregates`)."""
