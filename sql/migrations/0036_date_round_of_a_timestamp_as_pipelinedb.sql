-- why: PipelineDB had one date_round, of a timestamptz. A timestamp (a literal, or now a stream
-- column of type timestamp) was cast to timestamptz in the session's time zone and rounded from
-- 2000-01-01 UTC, and the answer was a timestamptz: date_round(TIMESTAMP '2001-02-16 20:38:40',
-- '3 hours') is 'Fri Feb 16 19:00:00 2001 PST' in PipelineDB's own regression test (date_round).
-- Migration 0022 added a timestamp overload that rounded the naive time as UTC and answered a
-- timestamp (18:00, no zone): every one of that test's answers differed. Without the overload,
-- PostgreSQL casts the timestamp and calls 0022's timestamptz function, as PipelineDB did.
DROP FUNCTION public.date_round(timestamp, interval);
