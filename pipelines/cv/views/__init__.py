"""Continuous views: how each is kept, maintained, read and changed.

What each aggregate call keeps (aggregate_calls, aggregates, general, extremes, windows), the
maintenance SQL (compiler), the relation users read (read_views), the resolved types (view_types),
and the catalog operations on views (view_catalog).
"""
