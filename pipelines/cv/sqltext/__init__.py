"""SQL text and pglast helpers: statements split and scanned, names and options read, literals written."""
