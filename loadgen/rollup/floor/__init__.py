"""The rollup chain in PostgreSQL alone: as feeds today, against the floor of applying it in the batch."""
