/*
 * keyed_arrays.c: the intersection of two bigint[] columns, each read from one row by its key.
 *
 * "Which of my friends like this object" is following(uid) ∩ likers(oid): two primary-key reads and
 * an intersection. Written as SQL or PL/pgSQL, each read is a statement: an executor started and
 * ended, a plan looked up, a snapshot pushed, and the PL/pgSQL call around them; together several
 * times the cost of the one index probe each read really needs. Here each read is that probe
 * (index_beginscan on the relation's unique single-column bigint index, under the calling query's
 * snapshot), and the intersection runs in C: a hash set of the smaller array probed with the larger
 * one, O(m + n), where SQL's INTERSECT sorts or hashes rows of both.
 *
 * The ids come from events, so anyone who can produce events chooses them: the hash is seeded at
 * random on every call (ids crafted to collide under one seed do not under the next), and a call
 * whose probes still run past a few per value drops the hash set for a radix sort and binary
 * searches, O((m + n) log m) whatever the ids. Every loop checks for interrupts, so
 * statement_timeout and pg_cancel_backend() stop a call on a huge array.
 *
 * A relation is a table or a plain view over one (a continuous view's read view): the view is
 * resolved to its table and column the way PostgreSQL's updatable views are, and permissions are
 * those of `SELECT column FROM relation WHERE key = $1` by the caller: SELECT on the relation (or on
 * both columns) for the caller, and on the table beneath a view for the view's owner, or for the
 * caller when the view has security_invoker. A view must show the key column, since such a query
 * could not read by key otherwise. A table with row-level security or inheritance children is
 * refused, since these reads would not apply its policies or see the children's rows.
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_am.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parsetree.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

PG_MODULE_MAGIC;

/* Where a (relation, column) pair is read from: a table, its key index and the array's column. */
typedef struct KeyedColumn
{
	Oid			table;
	Oid			key_index;
	AttrNumber	column;
} KeyedColumn;

/*
 * What resolve() found for a (relation, column) pair, kept for the backend's later calls: finding a
 * view's table and a table's key index costs more than the read itself. Any relcache invalidation
 * (a view replaced, altered or given to another owner, an index dropped, a column altered,
 * anywhere) empties the cache; permissions are checked on every call all the same, since a grant or
 * a role's membership can change without one.
 */
typedef struct ResolvedColumn
{
	Oid			relation;		/* what the caller named: the table, or a view of it */
	NameData	column;
	AttrNumber	named_key;		/* the key's and the array's columns in `relation` */
	AttrNumber	named_array;
	bool		is_view;
	bool		invoker_rights; /* a security_invoker view: its table is checked as the caller */
	Oid			view_owner;
	AttrNumber	table_key;		/* the key's column in the table (the array's is keyed.column) */
	KeyedColumn keyed;
} ResolvedColumn;

#define RESOLVED_SLOTS 16
static ResolvedColumn resolved[RESOLVED_SLOTS];
static int	resolved_count = 0;
static int	resolved_next = 0;

/*
 * streamviews.intersection_hash_seed: 0 (the default) seeds each call's hash at random; any other
 * value fixes the seed, so that tests can craft ids that collide and see the call stay bounded.
 * Superuser only: a fixed seed is what an attacker would need.
 */
static int	intersection_hash_seed = 0;

void		_PG_init(void);

static void
forget_resolved(Datum arg, Oid relation)
{
	resolved_count = 0;
	resolved_next = 0;
}

void
_PG_init(void)
{
	CacheRegisterRelcacheCallback(forget_resolved, (Datum) 0);
	DefineCustomIntVariable("streamviews.intersection_hash_seed",
							"Fixes the seed of keyed_arrays_intersection's hash (0: random per call).",
							"For tests only: with a known seed, ids can be crafted to collide.",
							&intersection_hash_seed, 0, 0, INT_MAX, PGC_SUSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("streamviews");
}

/* An int8 array's elements, NULLs left out: the array's own storage when it has none. */
typedef struct Int8Elements
{
	int64	   *values;
	int			count;
} Int8Elements;

static void
permission_denied(Oid relation)
{
	aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relation)), get_rel_name(relation));
}

/*
 * `role` may read columns `key` and `array` of `relation`, as a query selecting them would check it
 * (ExecCheckRTEPerms): SELECT on the relation, or else on each of the two columns.
 */
static void
check_select(Oid relation, Oid role, AttrNumber key, AttrNumber array)
{
	if (pg_class_aclcheck(relation, role, ACL_SELECT) == ACLCHECK_OK)
		return;
	if (pg_attribute_aclcheck(relation, key, role, ACL_SELECT) != ACLCHECK_OK ||
		pg_attribute_aclcheck(relation, array, role, ACL_SELECT) != ACLCHECK_OK)
		permission_denied(relation);
}

/* The checks of `SELECT column FROM relation WHERE key = $1` run by the current user. */
static void
check_permissions(const ResolvedColumn *entry)
{
	Oid			user = GetUserId();

	check_select(entry->relation, user, entry->named_key, entry->named_array);
	if (entry->is_view)
		check_select(entry->keyed.table, entry->invoker_rights ? user : entry->view_owner,
					 entry->table_key, entry->keyed.column);
}

/*
 * The table a plain view reads, and the range-table index of that table in its query: the view must
 * select columns of one table with no condition, grouping or other clause that would make a row of
 * the view anything but a row of the table.
 */
static Query *
plain_view_query(Relation view, Index *rtindex)
{
	Query	   *query = get_view_query(view);
	RangeTblRef *from;
	RangeTblEntry *rte;

	if (list_length(query->jointree->fromlist) != 1 || query->jointree->quals != NULL ||
		query->groupClause != NIL || query->havingQual != NULL || query->distinctClause != NIL ||
		query->setOperations != NULL || query->limitCount != NULL || query->limitOffset != NULL ||
		query->hasAggs || query->hasWindowFuncs || query->hasTargetSRFs || query->hasSubLinks ||
		query->cteList != NIL || !IsA(linitial(query->jointree->fromlist), RangeTblRef))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("view \"%s\" is not a plain view of one table", RelationGetRelationName(view))));
	from = linitial_node(RangeTblRef, query->jointree->fromlist);
	rte = rt_fetch(from->rtindex, query->rtable);
	if (rte->rtekind != RTE_RELATION || rte->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("view \"%s\" does not read a table", RelationGetRelationName(view))));
	*rtindex = from->rtindex;
	return query;
}

/* The table's column a view's output is, or 0 when the output is anything else (an expression). */
static AttrNumber
table_column_of(TargetEntry *entry, Index rtindex)
{
	Var		   *var = (Var *) entry->expr;

	if (entry->resjunk || !IsA(var, Var) || var->varno != rtindex || var->varlevelsup != 0 || var->varattno <= 0)
		return 0;
	return var->varattno;
}

/* The view's column named `column`: its number in the view, and the table's column it shows. */
static void
resolve_view_column(Relation view, Query *query, Index rtindex, const char *column,
					AttrNumber *view_attnum, AttrNumber *table_attnum)
{
	ListCell   *cell;

	foreach(cell, query->targetList)
	{
		TargetEntry *entry = lfirst_node(TargetEntry, cell);

		if (entry->resjunk || entry->resname == NULL || strcmp(entry->resname, column) != 0)
			continue;
		*table_attnum = table_column_of(entry, rtindex);
		if (*table_attnum == 0)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("column \"%s\" of view \"%s\" is not a column of its table", column,
							RelationGetRelationName(view))));
		*view_attnum = entry->resno;
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_COLUMN),
			 errmsg("column \"%s\" of view \"%s\" does not exist", column, RelationGetRelationName(view))));
}

/* The view's first column showing the table's column `table_attnum`, or an error. */
static AttrNumber
view_column_showing(Relation view, Query *query, Index rtindex, AttrNumber table_attnum, const char *what)
{
	ListCell   *cell;

	foreach(cell, query->targetList)
	{
		TargetEntry *entry = lfirst_node(TargetEntry, cell);

		if (entry->resname != NULL && table_column_of(entry, rtindex) == table_attnum)
			return entry->resno;
	}
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("view \"%s\" does not show its table's key column \"%s\"", RelationGetRelationName(view), what)));
	return 0;					/* not reached */
}

/* The table's unique btree index on one bigint column, with no predicate or expression: its key. */
static Oid
find_key_index(Relation table, AttrNumber *key_attnum)
{
	List	   *indexes = RelationGetIndexList(table);
	ListCell   *cell;
	Oid			found = InvalidOid;

	foreach(cell, indexes)
	{
		Relation	index = index_open(lfirst_oid(cell), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		usable = form->indisunique && form->indisvalid && form->indnkeyatts == 1 &&
			form->indkey.values[0] > 0 && index->rd_rel->relam == BTREE_AM_OID &&
			RelationGetIndexPredicate(index) == NIL &&
			TupleDescAttr(RelationGetDescr(table), form->indkey.values[0] - 1)->atttypid == INT8OID;

		if (usable)
			*key_attnum = form->indkey.values[0];
		index_close(index, NoLock);
		if (usable)
		{
			found = lfirst_oid(cell);
			break;
		}
	}
	list_free(indexes);
	if (!OidIsValid(found))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has no unique index on one bigint column", RelationGetRelationName(table))));
	return found;
}

/*
 * Resolve `relation`.`column` to a table, its key index and a bigint[] column, and the columns and
 * roles whose permissions a query through it would check; those checks are made last, but nothing
 * is said about a relation the caller may read no column of.
 */
static ResolvedColumn
resolve_uncached(Oid relation, const char *column)
{
	ResolvedColumn entry;
	Relation	named = relation_open(relation, AccessShareLock);
	Relation	table;
	Query	   *view_query = NULL;
	Index		rtindex = 0;

	if (pg_class_aclcheck(relation, GetUserId(), ACL_SELECT) != ACLCHECK_OK &&
		pg_attribute_aclcheck_all(relation, GetUserId(), ACL_SELECT, ACLMASK_ANY) != ACLCHECK_OK)
		permission_denied(relation);
	memset(&entry, 0, sizeof(entry));
	entry.relation = relation;
	namestrcpy(&entry.column, column);
	if (named->rd_rel->relkind == RELKIND_VIEW)
	{
		view_query = plain_view_query(named, &rtindex);
		resolve_view_column(named, view_query, rtindex, column, &entry.named_array, &entry.keyed.column);
		entry.keyed.table = rt_fetch(rtindex, view_query->rtable)->relid;
		entry.is_view = true;
		entry.invoker_rights = RelationHasSecurityInvoker(named);
		entry.view_owner = named->rd_rel->relowner;
	}
	else if (named->rd_rel->relkind == RELKIND_RELATION)
	{
		entry.keyed.table = relation;
		entry.keyed.column = get_attnum(relation, column);
		if (entry.keyed.column <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of relation \"%s\" does not exist", column,
							RelationGetRelationName(named))));
		entry.named_array = entry.keyed.column;
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table or a view", RelationGetRelationName(named))));

	table = table_open(entry.keyed.table, AccessShareLock);
	if (table->rd_rel->relrowsecurity)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has row-level security, which these reads would not apply",
						RelationGetRelationName(table))));
	if (has_subclass(entry.keyed.table))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has inheritance children, whose rows these reads would not see",
						RelationGetRelationName(table))));
	if (TupleDescAttr(RelationGetDescr(table), entry.keyed.column - 1)->atttypid != INT8ARRAYOID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" is not of type bigint[]", column)));
	entry.keyed.key_index = find_key_index(table, &entry.table_key);
	entry.named_key = entry.table_key;
	if (entry.is_view)
		entry.named_key = view_column_showing(named, view_query, rtindex, entry.table_key,
											  get_attname(entry.keyed.table, entry.table_key, false));
	table_close(table, NoLock);
	relation_close(named, NoLock);
	check_permissions(&entry);
	return entry;
}

/*
 * resolve_uncached() through the backend's cache. Locking the named relation first takes in any
 * pending invalidation, so a hit is never older than the relation's current definition.
 */
static KeyedColumn
resolve(Oid relation, const char *column)
{
	ResolvedColumn *entry;

	LockRelationOid(relation, AccessShareLock);
	for (int i = 0; i < resolved_count; i++)
	{
		entry = &resolved[i];
		if (entry->relation == relation && strcmp(NameStr(entry->column), column) == 0)
		{
			check_permissions(entry);
			return entry->keyed;
		}
	}
	{
		ResolvedColumn found = resolve_uncached(relation, column);

		/* Written only once resolved and permitted: an error above leaves every entry as it was. */
		entry = &resolved[resolved_next];
		*entry = found;
		resolved_next = (resolved_next + 1) % RESOLVED_SLOTS;
		resolved_count = Min(resolved_count + 1, RESOLVED_SLOTS);
		return entry->keyed;
	}
}

/* The array in `keyed`'s row whose key is `key`, detoasted and copied; NULL when no row or NULL. */
static ArrayType *read_array(const KeyedColumn *keyed, int64 key)
{
	Relation	table = table_open(keyed->table, AccessShareLock);
	Relation	index = index_open(keyed->key_index, AccessShareLock);
	IndexScanDesc scan = index_beginscan(table, index, GetActiveSnapshot(), 1, 0);
	TupleTableSlot *slot = table_slot_create(table, NULL);
	ScanKeyData scan_key;
	ArrayType  *array = NULL;

	ScanKeyInit(&scan_key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(key));
	index_rescan(scan, &scan_key, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		value = slot_getattr(slot, keyed->column, &isnull);

		/* A copy: the tuple's page is released below. */
		if (!isnull)
			array = DatumGetArrayTypePCopy(value);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(table, NoLock);
	return array;
}

static Int8Elements elements_of(ArrayType *array)
{
	Int8Elements elements = {NULL, 0};

	if (array == NULL || ARR_NDIM(array) == 0)
		return elements;
	if (!ARR_HASNULL(array))
	{
		elements.values = (int64 *) ARR_DATA_PTR(array);
		elements.count = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
	}
	else
	{
		Datum	   *datums;
		bool	   *nulls;
		int			count;

		deconstruct_array(array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
						  &datums, &nulls, &count);
		elements.values = palloc(sizeof(int64) * Max(count, 1));
		for (int i = 0; i < count; i++)
		{
			CHECK_FOR_INTERRUPTS();
			if (!nulls[i])
				elements.values[elements.count++] = DatumGetInt64(datums[i]);
		}
	}
	return elements;
}

/*
 * A 64-bit mixer (MurmurHash3's finalizer): every bit of the result depends on every bit of the
 * value and the seed. It is a bijection, which is what lets a test with a fixed seed (and only
 * such a test) invert it to craft colliding ids.
 */
static inline uint64
mix64(uint64 value, uint64 seed)
{
	uint64		h = value ^ seed;

	h ^= h >> 33;
	h *= UINT64CONST(0xff51afd7ed558ccd);
	h ^= h >> 33;
	h *= UINT64CONST(0xc4ceb9fe1a85ec53);
	h ^= h >> 33;
	return h;
}

/* Signed order as unsigned order: the sign bit flipped. */
static inline uint64
sort_key(int64 value)
{
	return (uint64) value ^ (UINT64CONST(1) << 63);
}

/* Sort `values` in place: LSD radix sort, a byte a pass, O(8 n) whatever the values. */
static void
radix_sort(int64 *values, int count)
{
	int64	   *from = values;
	int64	   *to;

	if (count < 2)
		return;
	to = palloc(sizeof(int64) * count);
	for (int shift = 0; shift < 64; shift += 8)
	{
		uint32		offsets[257] = {0};
		int64	   *swap;

		for (int i = 0; i < count; i++)
		{
			CHECK_FOR_INTERRUPTS();
			offsets[((sort_key(from[i]) >> shift) & 0xFF) + 1]++;
		}
		if (offsets[((sort_key(from[0]) >> shift) & 0xFF) + 1] == (uint32) count)
			continue;			/* every value has the same byte here */
		for (int b = 0; b < 256; b++)
			offsets[b + 1] += offsets[b];
		for (int i = 0; i < count; i++)
		{
			CHECK_FOR_INTERRUPTS();
			to[offsets[(sort_key(from[i]) >> shift) & 0xFF]++] = from[i];
		}
		swap = from;
		from = to;
		to = swap;
	}
	if (from != values)
		memcpy(values, from, sizeof(int64) * count);
	pfree(from == values ? to : from);
}

/* The index of `value` in `sorted` (distinct, ascending), or -1. */
static inline int
find_sorted(const int64 *sorted, int count, int64 value)
{
	int			low = 0;
	int			high = count - 1;

	while (low <= high)
	{
		int			middle = low + (high - low) / 2;

		if (sorted[middle] == value)
			return middle;
		if (sorted[middle] < value)
			low = middle + 1;
		else
			high = middle - 1;
	}
	return -1;
}

/*
 * The intersection when the hash set gave up: the distinct values of `small` sorted, each value of
 * `large` searched in them, then `small` read again in its order. O((m + n) log m) for any values.
 */
static int
intersect_sorted(Int8Elements small, Int8Elements large, Datum *common)
{
	int64	   *sorted = palloc(sizeof(int64) * small.count);
	uint8	   *state;			/* 0 absent from `large`, 1 present, 2 already given */
	int			distinct = 0;
	int			found = 0;

	memcpy(sorted, small.values, sizeof(int64) * small.count);
	radix_sort(sorted, small.count);
	for (int i = 0; i < small.count; i++)
		if (distinct == 0 || sorted[distinct - 1] != sorted[i])
			sorted[distinct++] = sorted[i];
	state = palloc0(distinct);
	for (int j = 0; j < large.count; j++)
	{
		int			at = find_sorted(sorted, distinct, large.values[j]);

		CHECK_FOR_INTERRUPTS();
		if (at >= 0)
			state[at] = 1;
	}
	for (int i = 0; i < small.count; i++)
	{
		int			at = find_sorted(sorted, distinct, small.values[i]);

		CHECK_FOR_INTERRUPTS();
		if (state[at] == 1)
		{
			common[found++] = Int64GetDatum(small.values[i]);
			state[at] = 2;
		}
	}
	return found;
}

/*
 * The intersection in an open-addressing set of `small` (at most half full), probed with each value
 * of `large`; -1 when the probes run past `budget` steps beyond their first slot, which values that
 * hash at random almost never do (fewer than 1.5 a value expected) and crafted ones must.
 */
static int
intersect_hashed(Int8Elements small, Int8Elements large, Datum *common)
{
	uint64		seed = intersection_hash_seed != 0 ? (uint64) intersection_hash_seed :
		pg_prng_uint64(&pg_global_prng_state);
	uint64		budget = 4 * ((uint64) small.count + large.count) + 1024;
	uint64		steps = 0;
	int			bits = 4;
	uint32		size;
	uint32		mask;
	int64	   *slots;
	uint32	   *position;		/* the slot of each value of `small` */
	uint8	   *state;			/* 0 empty, 1 holds a value, 2 one `large` has too, 3 given */
	int			found = 0;

	while (((uint64) 1 << bits) < (uint64) small.count * 2)
		bits++;
	size = (uint32) 1 << bits;
	mask = size - 1;
	slots = palloc(sizeof(int64) * size);
	position = palloc(sizeof(uint32) * small.count);
	state = palloc0(size);
	for (int i = 0; i < small.count; i++)
	{
		uint32		at = (uint32) (mix64(small.values[i], seed) >> (64 - bits));

		CHECK_FOR_INTERRUPTS();
		while (state[at] != 0 && slots[at] != small.values[i])
		{
			if (++steps > budget)
				return -1;
			at = (at + 1) & mask;
		}
		slots[at] = small.values[i];
		state[at] = 1;
		position[i] = at;
	}
	for (int j = 0; j < large.count; j++)
	{
		uint32		at = (uint32) (mix64(large.values[j], seed) >> (64 - bits));

		CHECK_FOR_INTERRUPTS();
		while (state[at] != 0 && slots[at] != large.values[j])
		{
			if (++steps > budget)
				return -1;
			at = (at + 1) & mask;
		}
		if (state[at] == 1)
			state[at] = 2;
	}
	for (int i = 0; i < small.count; i++)
	{
		if (state[position[i]] == 2)
		{
			common[found++] = Int64GetDatum(small.values[i]);
			state[position[i]] = 3; /* a repeated value of `small` is given once */
		}
	}
	return found;
}

/*
 * The distinct values of `small` that `large` holds, in the order of `small`. A few values are
 * compared directly; otherwise in a hash set, or sorted when the hash set meets too many collisions.
 */
static ArrayType *
intersect(Int8Elements small, Int8Elements large)
{
	Datum	   *common = palloc(sizeof(Datum) * Max(small.count, 1));
	int			found = 0;

	if (small.count <= 8)
	{
		for (int i = 0; i < small.count; i++)
		{
			bool		seen = false;

			for (int j = 0; j < i && !seen; j++)
				seen = small.values[j] == small.values[i];
			for (int j = 0; j < large.count && !seen; j++)
			{
				if ((j & 0xFFF) == 0)
					CHECK_FOR_INTERRUPTS();
				if (large.values[j] == small.values[i])
				{
					common[found++] = Int64GetDatum(small.values[i]);
					break;
				}
			}
		}
	}
	else
	{
		found = intersect_hashed(small, large, common);
		if (found < 0)
			found = intersect_sorted(small, large, common);
	}
	if (found == 0)
		return construct_empty_array(INT8OID);
	return construct_array(common, found, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

PG_FUNCTION_INFO_V1(keyed_arrays_intersection);

/*
 * keyed_arrays_intersection(left regclass, left_key bigint, left_column name,
 *                           right regclass, right_key bigint, right_column name) RETURNS bigint[]
 *
 * The values both arrays hold, each value once, in the order of the smaller array: '{}' when either
 * row is missing or its array is NULL or empty. The left row is read first and, when it gives
 * nothing, the right one is not read at all: put first the side that is more often empty.
 */
Datum
keyed_arrays_intersection(PG_FUNCTION_ARGS)
{
	KeyedColumn left = resolve(PG_GETARG_OID(0), NameStr(*PG_GETARG_NAME(2)));
	Int8Elements left_values = elements_of(read_array(&left, PG_GETARG_INT64(1)));
	KeyedColumn right;
	Int8Elements right_values;

	if (left_values.count == 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT8OID));
	right = resolve(PG_GETARG_OID(3), NameStr(*PG_GETARG_NAME(5)));
	right_values = elements_of(read_array(&right, PG_GETARG_INT64(4)));
	if (right_values.count == 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(INT8OID));
	if (left_values.count <= right_values.count)
		PG_RETURN_ARRAYTYPE_P(intersect(left_values, right_values));
	PG_RETURN_ARRAYTYPE_P(intersect(right_values, left_values));
}
