"""Audit log: writer, ctid puller, lag and queries beside the seed's approach (`python -m loadgen.audit`)."""
