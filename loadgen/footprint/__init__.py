"""The local stack: start-up times and memory (`python -m loadgen.footprint`, `make footprint`)."""
