/*
 * sketches.c: Bloom filters and count-min sketches for continuous views (PipelineDB's bloom_agg and
 * freq_agg), which neither Debian's hll nor tdigest extension offers.
 *
 * Both are plain bytea values, so a view stores them in a column and merges a batch into the stored
 * one in its upsert: a batch's values come in one call per group (`*_add(NULL, array_agg(x), ...)`,
 * one palloc for the whole batch), and two sketches of the same shape merge bit by bit (Bloom: OR)
 * or counter by counter (count-min: +), so the order batches come in never matters.
 *
 * A value is hashed through its type's text output (hash_bytes_extended with two seeds; the k or
 * depth positions by double hashing, h1 + i * h2): bloom_contains(b, 5) finds a bigint 5 added to b,
 * whatever the integer type it is asked with. NULL values are skipped.
 *
 * Layouts (native byte order: a sketch is read by the server that wrote it):
 *   Bloom:     uint32 magic, uint32 k, uint64 m (bits), then m bits
 *   count-min: uint32 magic, uint32 depth, uint32 width, Oid element, int64 total, int64 counters[depth][width]
 * `element` is the type of the values counted (0 in sketches made before version 1.4), so that
 * freq(sketch, '042') reads the literal as that type, as PipelineDB did: the integer 42.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "port/pg_bitutils.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#define BLOOM_MAGIC 0x424c4f31	/* "BLO1" */
#define FREQ_MAGIC 0x434d5331	/* "CMS1" */
#define BLOOM_MAX_BITS ((uint64) 1 << 33)	/* 1 GB of bits: refused beyond */
#define FREQ_MAX_COUNTERS (1 << 24)
/* PipelineDB's defaults (pipelines/cv/frontend/pipelinedb_calls.py has the same). */
#define BLOOM_DEFAULT_P 0.02
#define BLOOM_DEFAULT_N 16384
#define FREQ_DEFAULT_EPS 0.002
#define FREQ_DEFAULT_P 0.995

typedef struct BloomHeader
{
	uint32		magic;
	uint32		k;
	uint64		m;
} BloomHeader;

typedef struct FreqHeader
{
	uint32		magic;
	uint32		depth;
	uint32		width;
	Oid			element;
	int64		total;
} FreqHeader;

/* The two hashes of a value's text form. */
static void
text_hashes(const char *text, uint64 *h1, uint64 *h2)
{
	size_t		len = strlen(text);

	*h1 = hash_bytes_extended((const unsigned char *) text, (int) len, 0x5eed0001);
	*h2 = hash_bytes_extended((const unsigned char *) text, (int) len, 0x5eed0002) | 1;
}

/* The two hashes of a value, through its type's output function. */
static void
value_hashes(Datum value, Oid typoutput, uint64 *h1, uint64 *h2)
{
	char	   *text = OidOutputFunctionCall(typoutput, value);

	text_hashes(text, h1, h2);
	pfree(text);
}

/* The non-NULL elements of an array argument, with their type's output function. */
static int
array_values(ArrayType *array, Datum **values, Oid *typoutput)
{
	Oid			element = ARR_ELEMTYPE(array);
	int16		typlen;
	bool		typbyval;
	char		typalign;
	bool		varlena;
	bool	   *nulls;
	int			n;
	int			kept = 0;

	get_typlenbyvalalign(element, &typlen, &typbyval, &typalign);
	getTypeOutputInfo(element, typoutput, &varlena);
	deconstruct_array(array, element, typlen, typbyval, typalign, values, &nulls, &n);
	for (int i = 0; i < n; i++)
		if (!nulls[i])
			(*values)[kept++] = (*values)[i];
	return kept;
}

/*
 * The two sketches a merge takes: true with `a` a copy to merge into and `b` the other; false when
 * either is NULL, with `a` the other one's copy (the result), or NULL when both are (fcinfo->isnull set).
 */
static bool
both_given(FunctionCallInfo fcinfo, bytea **a, bytea **b)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
	{
		*a = PG_ARGISNULL(0) && PG_ARGISNULL(1) ? NULL
			: PG_ARGISNULL(0) ? PG_GETARG_BYTEA_P_COPY(1) : PG_GETARG_BYTEA_P_COPY(0);
		fcinfo->isnull = *a == NULL;
		return false;
	}
	*a = PG_GETARG_BYTEA_P_COPY(0);
	*b = PG_GETARG_BYTEA_PP(1);
	return true;
}

static BloomHeader *
bloom_of(bytea *b)
{
	BloomHeader *h = (BloomHeader *) VARDATA_ANY(b);

	if (VARSIZE_ANY_EXHDR(b) < sizeof(BloomHeader) || h->magic != BLOOM_MAGIC || h->m < 8 || h->m > BLOOM_MAX_BITS
		|| h->k < 1 || VARSIZE_ANY_EXHDR(b) != sizeof(BloomHeader) + (h->m + 7) / 8)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("not a Bloom filter of bloom_agg")));
	return h;
}

static bytea *
bloom_new(double p, int64 n)
{
	uint64		m;
	uint32		k;
	Size		size;
	bytea	   *b;
	BloomHeader *h;

	if (!(p > 0 && p < 1) || n < 1)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("bloom_agg: p must be in (0, 1) and n at least 1")));
	m = (uint64) ceil(-(double) n * log(p) / (M_LN2 * M_LN2));
	if (m < 8)
		m = 8;
	if (m > BLOOM_MAX_BITS)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("bloom_agg: p and n ask for too many bits")));
	k = (uint32) Max(1, (int) round((double) m / n * M_LN2));
	size = VARHDRSZ + sizeof(BloomHeader) + (m + 7) / 8;
	b = (bytea *) palloc0(size);
	SET_VARSIZE(b, size);
	h = (BloomHeader *) VARDATA(b);
	h->magic = BLOOM_MAGIC;
	h->k = k;
	h->m = m;
	return b;
}

static void
bloom_insert(BloomHeader *h, Datum value, Oid typoutput)
{
	uint8	   *bits = (uint8 *) (h + 1);
	uint64		h1,
				h2;

	value_hashes(value, typoutput, &h1, &h2);
	for (uint32 j = 0; j < h->k; j++)
	{
		uint64		bit = (h1 + j * h2) % h->m;

		bits[bit / 8] |= (uint8) (1 << (bit % 8));
	}
}

/*
 * The state argument to add to: a copy (a new filter or sketch made by `make` when NULL), or the
 * argument itself inside an aggregate, which owns its state (no copy of 16 or 64 KB per row).
 */
static bytea *
state_to_add_to(FunctionCallInfo fcinfo, bytea *(*make) (FunctionCallInfo))
{
	if (PG_ARGISNULL(0))
		return PG_NARGS() == 4 && (PG_ARGISNULL(2) || PG_ARGISNULL(3)) ? NULL : make(fcinfo);
	if (AggCheckCallContext(fcinfo, NULL))
		return PG_GETARG_BYTEA_P(0);
	return PG_GETARG_BYTEA_P_COPY(0);
}

/* A new filter sized by the call's p and n, or PipelineDB's defaults when it has none (bloom_agg(x)). */
static bytea *
bloom_make(FunctionCallInfo fcinfo)
{
	if (PG_NARGS() < 4)
		return bloom_new(BLOOM_DEFAULT_P, BLOOM_DEFAULT_N);
	return bloom_new(PG_GETARG_FLOAT8(2), PG_GETARG_INT64(3));
}

/* The filter's bits with one value set; what both ways of adding (a batch, a row) run per value. */
static void
bloom_insert_into(bytea *b, Datum value, Oid typoutput)
{
	bloom_insert(bloom_of(b), value, typoutput);
}

/* `*_add(state, values anyarray, ...)`: a batch's values added; a new sketch by `make` when state is NULL. */
static Datum
sketch_add(FunctionCallInfo fcinfo, bytea *(*make) (FunctionCallInfo), void (*insert) (bytea *, Datum, Oid))
{
	bytea	   *b = state_to_add_to(fcinfo, make);
	Datum	   *values;
	Oid			typoutput;
	int			n;

	if (b == NULL)
		PG_RETURN_NULL();
	if (PG_ARGISNULL(1))
		PG_RETURN_BYTEA_P(b);
	n = array_values(PG_GETARG_ARRAYTYPE_P(1), &values, &typoutput);
	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		insert(b, values[i], typoutput);
	}
	PG_RETURN_BYTEA_P(b);
}

/* `*_add_value(state, value, ...)`: one value added; the transition function of bloom_agg / freq_agg. */
static Datum
sketch_add_value(FunctionCallInfo fcinfo, bytea *(*make) (FunctionCallInfo), void (*insert) (bytea *, Datum, Oid))
{
	bytea	   *b = state_to_add_to(fcinfo, make);
	Oid			typoutput;
	bool		varlena;

	if (b == NULL)
		PG_RETURN_NULL();
	if (!PG_ARGISNULL(1))
	{
		getTypeOutputInfo(get_fn_expr_argtype(fcinfo->flinfo, 1), &typoutput, &varlena);
		insert(b, PG_GETARG_DATUM(1), typoutput);
	}
	PG_RETURN_BYTEA_P(b);
}

PG_FUNCTION_INFO_V1(sv_bloom_add);

/* bloom_add(bloom, values anyarray, p, n): the filter (a new one sized by p and n when NULL) with the values added. */
Datum
sv_bloom_add(PG_FUNCTION_ARGS)
{
	return sketch_add(fcinfo, bloom_make, bloom_insert_into);
}

PG_FUNCTION_INFO_V1(sv_bloom_add_value);

/* bloom_add_value(bloom, value [, p, n]): one value added; the transition function of the aggregate bloom_agg. */
Datum
sv_bloom_add_value(PG_FUNCTION_ARGS)
{
	return sketch_add_value(fcinfo, bloom_make, bloom_insert_into);
}

PG_FUNCTION_INFO_V1(sv_bloom_union);

/* bloom_union(a, b): the filter of both streams (same p and n); NULL on one side gives the other. */
Datum
sv_bloom_union(PG_FUNCTION_ARGS)
{
	bytea	   *a,
			   *b;
	BloomHeader *ha,
			   *hb;
	uint8	   *bits_a,
			   *bits_b;

	if (!both_given(fcinfo, &a, &b))
		return a ? PointerGetDatum(a) : (Datum) 0;
	ha = bloom_of(a);
	hb = bloom_of(b);
	if (ha->m != hb->m || ha->k != hb->k)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("bloom_union: the filters differ in size (bloom_agg's p and n)")));
	bits_a = (uint8 *) (ha + 1);
	bits_b = (uint8 *) (hb + 1);
	for (uint64 i = 0; i < (ha->m + 7) / 8; i++)
		bits_a[i] |= bits_b[i];
	PG_RETURN_BYTEA_P(a);
}

PG_FUNCTION_INFO_V1(sv_bloom_contains);

/* bloom_contains(bloom, value): false when the value was surely never added; true when it may have been. */
Datum
sv_bloom_contains(PG_FUNCTION_ARGS)
{
	bytea	   *b = PG_GETARG_BYTEA_PP(0);
	BloomHeader *h = bloom_of(b);
	uint8	   *bits = (uint8 *) (h + 1);
	Oid			typoutput;
	bool		varlena;
	uint64		h1,
				h2;

	getTypeOutputInfo(get_fn_expr_argtype(fcinfo->flinfo, 1), &typoutput, &varlena);
	value_hashes(PG_GETARG_DATUM(1), typoutput, &h1, &h2);
	for (uint32 j = 0; j < h->k; j++)
	{
		uint64		bit = (h1 + j * h2) % h->m;

		if (!(bits[bit / 8] & (1 << (bit % 8))))
			PG_RETURN_BOOL(false);
	}
	PG_RETURN_BOOL(true);
}

PG_FUNCTION_INFO_V1(sv_bloom_cardinality);

/* bloom_cardinality(bloom): the distinct values added, estimated from the bits set (Swamidass & Baldi). */
Datum
sv_bloom_cardinality(PG_FUNCTION_ARGS)
{
	bytea	   *b = PG_GETARG_BYTEA_PP(0);
	BloomHeader *h = bloom_of(b);
	uint8	   *bits = (uint8 *) (h + 1);
	uint64		set = pg_popcount((const char *) bits, (int) ((h->m + 7) / 8));

	if (set >= h->m)
		PG_RETURN_INT64((int64) h->m);	/* full: the estimate diverges */
	PG_RETURN_INT64((int64) llround(-((double) h->m / h->k) * log(1.0 - (double) set / h->m)));
}

static FreqHeader *
freq_of(bytea *b)
{
	FreqHeader *h = (FreqHeader *) VARDATA_ANY(b);

	if (VARSIZE_ANY_EXHDR(b) < sizeof(FreqHeader) || h->magic != FREQ_MAGIC || h->depth < 1 || h->width < 1
		|| (uint64) h->depth * h->width > FREQ_MAX_COUNTERS
		|| VARSIZE_ANY_EXHDR(b) != sizeof(FreqHeader) + (Size) h->depth * h->width * sizeof(int64))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("not a count-min sketch of freq_agg")));
	return h;
}

/* A new sketch sized by the call's eps and p, or PipelineDB's defaults when it has none (freq_agg(x)). */
static bytea *
freq_make(FunctionCallInfo fcinfo)
{
	double		eps = PG_NARGS() < 4 ? FREQ_DEFAULT_EPS : PG_GETARG_FLOAT8(2);
	double		p = PG_NARGS() < 4 ? FREQ_DEFAULT_P : PG_GETARG_FLOAT8(3);
	uint32		width,
				depth;
	Size		size;
	bytea	   *b;
	FreqHeader *h;

	if (!(eps > 0 && eps < 1) || !(p > 0 && p < 1))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("freq_agg: eps and p must be in (0, 1)")));
	width = (uint32) ceil(M_E / eps);
	depth = (uint32) Max(1, ceil(log(1.0 / (1.0 - p))));
	if ((double) width * depth > FREQ_MAX_COUNTERS)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("freq_agg: eps and p ask for too many counters")));
	size = VARHDRSZ + sizeof(FreqHeader) + (Size) width * depth * sizeof(int64);
	b = (bytea *) palloc0(size);
	SET_VARSIZE(b, size);
	h = (FreqHeader *) VARDATA(b);
	h->magic = FREQ_MAGIC;
	h->depth = depth;
	h->width = width;
	return b;
}

static void
freq_insert(FreqHeader *h, Datum value, Oid typoutput)
{
	int64	   *counters = (int64 *) (h + 1);
	uint64		h1,
				h2;

	value_hashes(value, typoutput, &h1, &h2);
	for (uint32 row = 0; row < h->depth; row++)
		counters[(Size) row * h->width + (h1 + row * h2) % h->width] += 1;
	h->total += 1;
}

static void
freq_insert_into(bytea *b, Datum value, Oid typoutput)
{
	freq_insert(freq_of(b), value, typoutput);
}

/* A sketch's element type, noted by its first add (a merge keeps either side's). */
static Datum
freq_note_type(FunctionCallInfo fcinfo, Datum sketch, Oid element)
{
	FreqHeader *h;

	if (fcinfo->isnull || !OidIsValid(element))
		return sketch;
	h = (FreqHeader *) VARDATA(DatumGetPointer(sketch));
	if (h->element == InvalidOid)
		h->element = element;
	return sketch;
}

PG_FUNCTION_INFO_V1(sv_freq_add);

/* freq_add(sketch, values anyarray, eps, p): the sketch (a new one sized by eps and p when NULL) with each value counted once. */
Datum
sv_freq_add(PG_FUNCTION_ARGS)
{
	Datum		sketch = sketch_add(fcinfo, freq_make, freq_insert_into);

	return freq_note_type(fcinfo, sketch, get_element_type(get_fn_expr_argtype(fcinfo->flinfo, 1)));
}

PG_FUNCTION_INFO_V1(sv_freq_add_value);

/* freq_add_value(sketch, value [, eps, p]): one value counted; the transition function of the aggregate freq_agg. */
Datum
sv_freq_add_value(PG_FUNCTION_ARGS)
{
	Datum		sketch = sketch_add_value(fcinfo, freq_make, freq_insert_into);

	return freq_note_type(fcinfo, sketch, get_fn_expr_argtype(fcinfo->flinfo, 1));
}

PG_FUNCTION_INFO_V1(sv_freq_merge);

/* freq_merge(a, b): the sketch of both streams (same eps and p); NULL on one side gives the other. */
Datum
sv_freq_merge(PG_FUNCTION_ARGS)
{
	bytea	   *a,
			   *b;
	FreqHeader *ha,
			   *hb;
	int64	   *ca,
			   *cb;

	if (!both_given(fcinfo, &a, &b))
		return a ? PointerGetDatum(a) : (Datum) 0;
	ha = freq_of(a);
	hb = freq_of(b);
	if (ha->depth != hb->depth || ha->width != hb->width)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("freq_merge: the sketches differ in size (freq_agg's eps and p)")));
	ca = (int64 *) (ha + 1);
	cb = (int64 *) (hb + 1);
	for (Size i = 0; i < (Size) ha->depth * ha->width; i++)
		ca[i] += cb[i];
	ha->total += hb->total;
	if (ha->element == InvalidOid)
		ha->element = hb->element;
	PG_RETURN_BYTEA_P(a);
}

/* The least of a value's counters: its count, never under the truth. */
static int64
freq_least(FreqHeader *h, uint64 h1, uint64 h2)
{
	int64	   *counters = (int64 *) (h + 1);
	int64		least = PG_INT64_MAX;

	for (uint32 row = 0; row < h->depth; row++)
		least = Min(least, counters[(Size) row * h->width + (h1 + row * h2) % h->width]);
	return least;
}

PG_FUNCTION_INFO_V1(sv_freq);

/* freq(sketch, value): how often the value was added, never under the truth (the least of its counters). */
Datum
sv_freq(PG_FUNCTION_ARGS)
{
	bytea	   *b = PG_GETARG_BYTEA_PP(0);
	FreqHeader *h = freq_of(b);
	Oid			typoutput;
	bool		varlena;
	uint64		h1,
				h2;

	getTypeOutputInfo(get_fn_expr_argtype(fcinfo->flinfo, 1), &typoutput, &varlena);
	value_hashes(PG_GETARG_DATUM(1), typoutput, &h1, &h2);
	PG_RETURN_INT64(freq_least(h, h1, h2));
}

PG_FUNCTION_INFO_V1(sv_freq_text);

/*
 * freq(sketch, text): how often a value written as text was added. An unknown-typed literal
 * (freq(f, '42')) resolves to this one: it is read as the type the sketch counts, so '042' finds the
 * integer 42 and 'abc' over integers is an error, as a cast would be; over text (or a sketch made
 * before 1.4, whose type is not known) the text is hashed as it is.
 */
Datum
sv_freq_text(PG_FUNCTION_ARGS)
{
	FreqHeader *h = freq_of(PG_GETARG_BYTEA_PP(0));
	char	   *given = text_to_cstring(PG_GETARG_TEXT_PP(1));
	Oid			element = h->element;
	uint64		h1,
				h2;

	if (OidIsValid(element) && element != TEXTOID && SearchSysCacheExists1(TYPEOID, ObjectIdGetDatum(element)))
	{
		Oid			typinput,
					typioparam,
					typoutput;
		bool		varlena;

		getTypeInputInfo(element, &typinput, &typioparam);
		getTypeOutputInfo(element, &typoutput, &varlena);
		given = OidOutputFunctionCall(typoutput, OidInputFunctionCall(typinput, given, typioparam, -1));
	}
	text_hashes(given, &h1, &h2);
	PG_RETURN_INT64(freq_least(h, h1, h2));
}

PG_FUNCTION_INFO_V1(sv_freq_total);

/* freq_total(sketch): the number of values added (PipelineDB's cmsketch_total). */
Datum
sv_freq_total(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(freq_of(PG_GETARG_BYTEA_PP(0))->total);
}

/*
 * keyed_max(key, value) / keyed_min(key, value) as aggregates of their own (a view keeps them as
 * max(key) and the value at it, pipelines/cv/views/pipelinedb_columns.py): the value at the greatest
 * (least) non-NULL key, a tie of keys keeping the least value, as a view does. The state lives in
 * the aggregate's memory context; keys compare with their type's btree order and the call's collation.
 */
typedef struct KeyedState
{
	bool		has_key;
	bool		value_null;
	Datum		key;
	Datum		value;
	int16		key_len;
	int16		value_len;
	bool		key_byval;
	bool		value_byval;
	TypeCacheEntry *key_type;
	TypeCacheEntry *value_type; /* its comparison breaks ties; none: the first value stays */
} KeyedState;

static int
keyed_compare(FunctionCallInfo fcinfo, TypeCacheEntry *type, Datum a, Datum b)
{
	return DatumGetInt32(FunctionCall2Coll(&type->cmp_proc_finfo, PG_GET_COLLATION(), a, b));
}

static Datum
keyed_step(FunctionCallInfo fcinfo, int sign)
{
	MemoryContext aggcontext;
	MemoryContext old;
	KeyedState *st;
	bool		take_key = false;
	bool		take_value = false;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("keyed_max/keyed_min called outside an aggregate")));
	st = PG_ARGISNULL(0) ? NULL : (KeyedState *) PG_GETARG_POINTER(0);
	if (st == NULL)
	{
		Oid			key_type = get_fn_expr_argtype(fcinfo->flinfo, 1);
		Oid			value_type = get_fn_expr_argtype(fcinfo->flinfo, 2);

		st = (KeyedState *) MemoryContextAllocZero(aggcontext, sizeof(KeyedState));
		get_typlenbyval(key_type, &st->key_len, &st->key_byval);
		get_typlenbyval(value_type, &st->value_len, &st->value_byval);
		st->key_type = lookup_type_cache(key_type, TYPECACHE_CMP_PROC_FINFO);
		if (!OidIsValid(st->key_type->cmp_proc))
			ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
							errmsg("keyed_max/keyed_min: type %s has no ordering", format_type_be(key_type))));
		st->value_type = lookup_type_cache(value_type, TYPECACHE_CMP_PROC_FINFO);
		if (!OidIsValid(st->value_type->cmp_proc))
			st->value_type = NULL;
		st->value_null = true;
	}
	if (PG_ARGISNULL(1))
		PG_RETURN_POINTER(st);
	if (!st->has_key)
		take_key = take_value = true;
	else
	{
		int			c = sign * keyed_compare(fcinfo, st->key_type, PG_GETARG_DATUM(1), st->key);

		take_key = take_value = c > 0;
		if (c == 0 && !PG_ARGISNULL(2))
			take_value = st->value_null
				|| (st->value_type && keyed_compare(fcinfo, st->value_type, PG_GETARG_DATUM(2), st->value) < 0);
	}
	old = MemoryContextSwitchTo(aggcontext);
	if (take_key)
	{
		if (st->has_key && !st->key_byval)
			pfree(DatumGetPointer(st->key));
		st->key = datumCopy(PG_GETARG_DATUM(1), st->key_byval, st->key_len);
		st->has_key = true;
	}
	if (take_value)
	{
		if (!st->value_null && !st->value_byval)
			pfree(DatumGetPointer(st->value));
		st->value_null = PG_ARGISNULL(2);
		st->value = st->value_null ? (Datum) 0 : datumCopy(PG_GETARG_DATUM(2), st->value_byval, st->value_len);
	}
	MemoryContextSwitchTo(old);
	PG_RETURN_POINTER(st);
}

PG_FUNCTION_INFO_V1(sv_keyed_max_step);
Datum
sv_keyed_max_step(PG_FUNCTION_ARGS)
{
	return keyed_step(fcinfo, 1);
}

PG_FUNCTION_INFO_V1(sv_keyed_min_step);
Datum
sv_keyed_min_step(PG_FUNCTION_ARGS)
{
	return keyed_step(fcinfo, -1);
}

PG_FUNCTION_INFO_V1(sv_keyed_final);

/* The value kept; NULL when no row had a key, or the value at it was NULL. */
Datum
sv_keyed_final(PG_FUNCTION_ARGS)
{
	KeyedState *st = PG_ARGISNULL(0) ? NULL : (KeyedState *) PG_GETARG_POINTER(0);

	if (st == NULL || !st->has_key || st->value_null)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(st->value);
}
