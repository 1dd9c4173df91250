"""Decoding a stream's records, generated from its CREATE STREAM.

The reference decoder (stream_decoder), its fast path for JSON (fast_json), and the column values,
CHECKs and DEFAULTs they share (fields, values, checks, expressions).
"""
