/*
 * buckets.c: PipelineDB's bucket_agg(x, bucket [, ts]) for continuous views: which bucket each distinct
 * value is in now. A value is in the bucket of its latest row (by arrival; with ts, by the greatest
 * ts, a tie taking the later row), so a value moving from bucket 0 to bucket 1 leaves bucket 0.
 * bucket_ids and bucket_cardinalities read how many distinct values each bucket holds.
 *
 * A state is a bytea: its values' 64-bit hashes (of their type's text output, as sketches.c hashes),
 * sorted, each with its bucket and timestamp. A batch's rows become such a state (one call per group,
 * `bucket_add(NULL, array_agg(x), array_agg(bucket), array_agg(ts))`), and two states merge in one
 * pass, the newer one (or the later ts) winning a value both hold: that is how a view adds a batch to
 * its stored row. The state grows with the distinct values (24 bytes each); two distinct values whose
 * hashes collide (about 1 in 10^11 for 10^4 values) count once.
 *
 * Layout (native byte order): uint32 magic, uint32 timed, uint64 n, then n BucketEntry, by hash.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#define BUCKET_MAGIC 0x424b5431	/* "BKT1" */
#define NO_TIME PG_INT64_MIN

typedef struct BucketHeader
{
	uint32		magic;
	uint32		timed;			/* 1: bucket_agg(x, bucket, ts), the later ts wins; 0: the later row */
	uint64		n;
} BucketHeader;

typedef struct BucketEntry
{
	uint64		hash;
	int64		ts;				/* NO_TIME when not timed */
	int64		bucket;			/* a smallint, widened: the entry stays 8-byte aligned */
} BucketEntry;

static BucketHeader *
buckets_of(bytea *b)
{
	BucketHeader *h = (BucketHeader *) VARDATA_ANY(b);

	/* n checked by division: a crafted n whose product wraps around must not pass */
	if (VARSIZE_ANY_EXHDR(b) < sizeof(BucketHeader) || h->magic != BUCKET_MAGIC
		|| h->n != (VARSIZE_ANY_EXHDR(b) - sizeof(BucketHeader)) / sizeof(BucketEntry)
		|| (VARSIZE_ANY_EXHDR(b) - sizeof(BucketHeader)) % sizeof(BucketEntry) != 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("not a bucket_agg state")));
	return h;
}

static bytea *
buckets_new(uint64 n, bool timed)
{
	Size		size = VARHDRSZ + sizeof(BucketHeader) + n * sizeof(BucketEntry);
	bytea	   *b = (bytea *) palloc0(size);
	BucketHeader *h = (BucketHeader *) VARDATA(b);

	SET_VARSIZE(b, size);
	h->magic = BUCKET_MAGIC;
	h->timed = timed ? 1 : 0;
	h->n = n;
	return b;
}

/* Does `newer` take the value from `older`? Untimed: always; timed: when its ts is not earlier. */
static bool
takes(const BucketEntry *newer, const BucketEntry *older, bool timed)
{
	return !timed || newer->ts >= older->ts;
}

/* Hash order, then the order rows came in (the index), so that a stable pass keeps the last row. */
typedef struct Indexed
{
	BucketEntry entry;
	int			index;
} Indexed;

static int
indexed_cmp(const void *a, const void *b)
{
	const Indexed *x = a;
	const Indexed *y = b;

	if (x->entry.hash != y->entry.hash)
		return x->entry.hash < y->entry.hash ? -1 : 1;
	return x->index < y->index ? -1 : x->index > y->index;
}

/* The state of a batch: values, buckets and (timed) ts side by side; NULL values or buckets skipped. */
static bytea *
buckets_of_batch(ArrayType *values, ArrayType *buckets, ArrayType *times)
{
	Oid			element = ARR_ELEMTYPE(values);
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Oid			typoutput;
	bool		varlena;
	Datum	   *vals,
			   *ids,
			   *ts = NULL;
	bool	   *val_nulls,
			   *id_nulls,
			   *ts_nulls = NULL;
	int			n,
				n_ids,
				n_ts = 0,
				kept = 0;
	Indexed    *rows;
	bytea	   *result;
	BucketEntry *out;
	uint64		written = 0;

	get_typlenbyvalalign(element, &typlen, &typbyval, &typalign);
	getTypeOutputInfo(element, &typoutput, &varlena);
	deconstruct_array(values, element, typlen, typbyval, typalign, &vals, &val_nulls, &n);
	deconstruct_array(buckets, INT2OID, 2, true, TYPALIGN_SHORT, &ids, &id_nulls, &n_ids);
	if (times)
		deconstruct_array(times, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &ts, &ts_nulls, &n_ts);
	if (n_ids != n || (times && n_ts != n))
		ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR), errmsg("bucket_add: arrays of different lengths")));
	rows = (Indexed *) palloc(sizeof(Indexed) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		char	   *text;

		CHECK_FOR_INTERRUPTS();
		if (val_nulls[i] || id_nulls[i] || (times && ts_nulls[i]))
			continue;
		text = OidOutputFunctionCall(typoutput, vals[i]);
		rows[kept].entry.hash = hash_bytes_extended((const unsigned char *) text, (int) strlen(text), 0x5eed0003);
		rows[kept].entry.ts = times ? DatumGetTimestampTz(ts[i]) : NO_TIME;
		rows[kept].entry.bucket = DatumGetInt16(ids[i]);
		rows[kept].index = i;
		kept++;
		pfree(text);
	}
	qsort(rows, kept, sizeof(Indexed), indexed_cmp);
	result = buckets_new(kept, times != NULL);
	out = (BucketEntry *) (((BucketHeader *) VARDATA(result)) + 1);
	for (int i = 0; i < kept; i++)
	{
		if (written > 0 && out[written - 1].hash == rows[i].entry.hash)
		{
			if (takes(&rows[i].entry, &out[written - 1], times != NULL))
				out[written - 1] = rows[i].entry;
			continue;
		}
		out[written++] = rows[i].entry;
	}
	((BucketHeader *) VARDATA(result))->n = written;
	SET_VARSIZE(result, VARHDRSZ + sizeof(BucketHeader) + written * sizeof(BucketEntry));
	pfree(rows);
	return result;
}

/* `older` and `newer` merged in one pass over both (sorted) states. */
static bytea *
buckets_merge(bytea *older, bytea *newer)
{
	BucketHeader *ho = buckets_of(older);
	BucketHeader *hn = buckets_of(newer);
	BucketEntry *o = (BucketEntry *) (ho + 1);
	BucketEntry *w = (BucketEntry *) (hn + 1);
	bool		timed = ho->timed;
	bytea	   *result;
	BucketEntry *out;
	uint64		i = 0,
				j = 0,
				written = 0;

	if (ho->timed != hn->timed)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("bucket_merge: a bucket_agg with ts and one without do not merge")));
	result = buckets_new(ho->n + hn->n, timed);
	out = (BucketEntry *) (((BucketHeader *) VARDATA(result)) + 1);
	while (i < ho->n || j < hn->n)
	{
		CHECK_FOR_INTERRUPTS();
		if (j == hn->n || (i < ho->n && o[i].hash < w[j].hash))
			out[written++] = o[i++];
		else if (i == ho->n || w[j].hash < o[i].hash)
			out[written++] = w[j++];
		else
		{
			out[written++] = takes(&w[j], &o[i], timed) ? w[j] : o[i];
			i++;
			j++;
		}
	}
	((BucketHeader *) VARDATA(result))->n = written;
	SET_VARSIZE(result, VARHDRSZ + sizeof(BucketHeader) + written * sizeof(BucketEntry));
	return result;
}

PG_FUNCTION_INFO_V1(sv_bucket_add);

/*
 * bucket_add(state, values anyarray, buckets smallint[], ts timestamptz[]): the state with a batch's
 * rows added, in their order (ts NULL: bucket_agg(x, bucket), the later row wins). NULL state: the
 * batch's own state (NULL when it has no row with a value and a bucket).
 */
Datum
sv_bucket_add(PG_FUNCTION_ARGS)
{
	bytea	   *batch;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
	{
		if (PG_ARGISNULL(0))
			PG_RETURN_NULL();
		PG_RETURN_BYTEA_P(PG_GETARG_BYTEA_P(0));
	}
	batch = buckets_of_batch(PG_GETARG_ARRAYTYPE_P(1), PG_GETARG_ARRAYTYPE_P(2),
							 PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3));
	if (((BucketHeader *) VARDATA(batch))->n == 0 && PG_ARGISNULL(0))
		PG_RETURN_NULL();
	if (PG_ARGISNULL(0))
		PG_RETURN_BYTEA_P(batch);
	PG_RETURN_BYTEA_P(buckets_merge(PG_GETARG_BYTEA_PP(0), batch));
}

PG_FUNCTION_INFO_V1(sv_bucket_merge);

/* bucket_merge(older, newer): both states, `newer` (or the later ts) winning a value both hold; NULL gives the other. */
Datum
sv_bucket_merge(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) && PG_ARGISNULL(1))
		PG_RETURN_NULL();
	if (PG_ARGISNULL(0))
		PG_RETURN_BYTEA_P(PG_GETARG_BYTEA_P(1));
	if (PG_ARGISNULL(1))
		PG_RETURN_BYTEA_P(PG_GETARG_BYTEA_P(0));
	PG_RETURN_BYTEA_P(buckets_merge(PG_GETARG_BYTEA_PP(0), PG_GETARG_BYTEA_PP(1)));
}

/* The distinct values per bucket id (a smallint: 65,536 counters), and how many ids have any. */
static int
bucket_counts(bytea *b, int64 *counts)
{
	BucketHeader *h = buckets_of(b);
	BucketEntry *e = (BucketEntry *) (h + 1);
	int			ids = 0;

	for (uint64 i = 0; i < h->n; i++)
	{
		if (e[i].bucket < PG_INT16_MIN || e[i].bucket > PG_INT16_MAX)
			ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("not a bucket_agg state")));
		if (counts[e[i].bucket - PG_INT16_MIN]++ == 0)
			ids++;
	}
	return ids;
}

/* bucket_ids (ascending) or bucket_cardinalities (in the same order) of a state. */
static Datum
bucket_array(FunctionCallInfo fcinfo, bool cardinalities)
{
	int64	   *counts = (int64 *) palloc0(sizeof(int64) * 65536);
	int			ids = bucket_counts(PG_GETARG_BYTEA_PP(0), counts);
	Datum	   *out = (Datum *) palloc(sizeof(Datum) * Max(ids, 1));
	int			k = 0;

	for (int i = 0; i < 65536; i++)
		if (counts[i] > 0)
			out[k++] = cardinalities ? Int32GetDatum((int32) counts[i]) : Int16GetDatum((int16) (i + PG_INT16_MIN));
	if (cardinalities)
		PG_RETURN_ARRAYTYPE_P(construct_array(out, ids, INT4OID, 4, true, TYPALIGN_INT));
	PG_RETURN_ARRAYTYPE_P(construct_array(out, ids, INT2OID, 2, true, TYPALIGN_SHORT));
}

PG_FUNCTION_INFO_V1(sv_bucket_ids);

/* bucket_ids(state): the buckets holding a value, ascending. */
Datum
sv_bucket_ids(PG_FUNCTION_ARGS)
{
	return bucket_array(fcinfo, false);
}

PG_FUNCTION_INFO_V1(sv_bucket_cardinalities);

/* bucket_cardinalities(state): the distinct values of each bucket, in bucket_ids' order. */
Datum
sv_bucket_cardinalities(PG_FUNCTION_ARGS)
{
	return bucket_array(fcinfo, true);
}

PG_FUNCTION_INFO_V1(sv_bucket_cardinality);

/* bucket_cardinality(state, bucket): the distinct values in one bucket now. */
Datum
sv_bucket_cardinality(PG_FUNCTION_ARGS)
{
	BucketHeader *h = buckets_of(PG_GETARG_BYTEA_PP(0));
	BucketEntry *e = (BucketEntry *) (h + 1);
	int16		bucket = PG_GETARG_INT16(1);
	int64		n = 0;

	for (uint64 i = 0; i < h->n; i++)
		n += e[i].bucket == bucket;
	PG_RETURN_INT64(n);
}
