"""View compilation: the model of a view turned into the SQL that keeps, maintains and reads it.

What each stored aggregate keeps and merges (aggregates, extremes, windows, general for a user's
aggregate kept as its state), the maintenance SQL (compiler, and stream_sql for a stream's own state
and batch), the relation users read (read_views), and the types PostgreSQL resolves for a view
(view_types). What a call of the select list is stored as is the front end's
(pipelines.cv.frontend.aggregate_calls); sql_text holds the pieces every statement is composed of.
"""
