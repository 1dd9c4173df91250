"""Page views through one runner, per view (`python -m loadgen.pageviews --view basic|issue13|issue13_hll`)."""
