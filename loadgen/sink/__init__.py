"""An upsert sink's cost on page views through one runner, and its event -> record latency."""
