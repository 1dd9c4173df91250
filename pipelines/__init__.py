"""Streaming pipelines: Kafka consumers, the continuous-view engine and the search puller."""
