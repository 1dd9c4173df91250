"""The front end: statements read into the model, against an explicit scope, with no database access.

statements (the entry: `parse`, a definitions text split), streams and columns (CREATE STREAM),
views, aggregate_calls and windows (CREATE CONTINUOUS VIEW), changes (ALTER and DROP). What a
statement needs to know of the database comes in a `pipelines.cv.model.Scope`.
"""
