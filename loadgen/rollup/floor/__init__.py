"""The rollup chain in PostgreSQL alone: as feeds today, against two emulated designs."""
