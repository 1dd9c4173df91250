"""What one definition costs with 1 and with 200 streams in the catalog (`python -m loadgen.definition_cost`)."""
