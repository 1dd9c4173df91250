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
 * A relation is a table or a plain view over one (a continuous view's read view): the view is
 * resolved to its table and column the way PostgreSQL's updatable views are, and permissions follow
 * PostgreSQL's rules for a query through the view: the caller needs SELECT on what it names, a
 * view's owner SELECT on the table beneath. A table with row-level security or inheritance children
 * is refused, since these reads would not apply its policies or see the children's rows.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_am.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
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
 * (a view replaced, an index dropped, a column altered, anywhere) empties the cache; permissions are
 * checked on every call all the same, since a role's membership can change without one.
 */
typedef struct ResolvedColumn
{
	Oid			relation;
	NameData	column;
	Oid			view_owner;		/* InvalidOid when `relation` is the table itself */
	KeyedColumn keyed;
} ResolvedColumn;

#define RESOLVED_SLOTS 16
static ResolvedColumn resolved[RESOLVED_SLOTS];
static int	resolved_count = 0;
static int	resolved_next = 0;

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
}

/* An int8 array's elements, NULLs left out: the array's own storage when it has none. */
typedef struct Int8Elements
{
	int64	   *values;
	int			count;
} Int8Elements;

static void check_select(Oid relation, Oid role)
{
	if (pg_class_aclcheck(relation, role, ACL_SELECT) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relation)),
					   get_rel_name(relation));
}

/*
 * The table and attribute a plain view's column is: the view must select columns of one table with
 * no condition, grouping or other clause that would make a row of the view anything but a row of
 * the table.
 */
static void resolve_view_column(Relation view, const char *column, Oid *table, AttrNumber *attnum)
{
	Query	   *query = get_view_query(view);
	RangeTblRef *from;
	RangeTblEntry *rte;
	ListCell   *cell;

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
	foreach(cell, query->targetList)
	{
		TargetEntry *entry = lfirst_node(TargetEntry, cell);

		if (entry->resjunk || entry->resname == NULL || strcmp(entry->resname, column) != 0)
			continue;
		if (!IsA(entry->expr, Var) || ((Var *) entry->expr)->varno != from->rtindex ||
			((Var *) entry->expr)->varlevelsup != 0 || ((Var *) entry->expr)->varattno <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("column \"%s\" of view \"%s\" is not a column of its table", column,
							RelationGetRelationName(view))));
		*table = rte->relid;
		*attnum = ((Var *) entry->expr)->varattno;
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_COLUMN),
			 errmsg("column \"%s\" of view \"%s\" does not exist", column, RelationGetRelationName(view))));
}

/* The table's unique btree index on one bigint column, with no predicate or expression: its key. */
static Oid find_key_index(Relation table)
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
 * Resolve `relation`.`column` to a table, its key index and a bigint[] column, checking permissions
 * on the way; `view_owner` is set to the view's owner, or InvalidOid for a table.
 */
static KeyedColumn resolve_uncached(Oid relation, const char *column, Oid *view_owner)
{
	KeyedColumn keyed;
	Relation	named = relation_open(relation, AccessShareLock);
	Relation	table;

	check_select(relation, GetUserId());
	*view_owner = InvalidOid;
	if (named->rd_rel->relkind == RELKIND_VIEW)
	{
		resolve_view_column(named, column, &keyed.table, &keyed.column);
		*view_owner = named->rd_rel->relowner;
		check_select(keyed.table, *view_owner);
	}
	else if (named->rd_rel->relkind == RELKIND_RELATION)
	{
		keyed.table = relation;
		keyed.column = get_attnum(relation, column);
		if (keyed.column <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of relation \"%s\" does not exist", column,
							RelationGetRelationName(named))));
	}
	else
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table or a view", RelationGetRelationName(named))));
	relation_close(named, NoLock);

	table = table_open(keyed.table, AccessShareLock);
	if (table->rd_rel->relrowsecurity)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has row-level security, which these reads would not apply",
						RelationGetRelationName(table))));
	if (has_subclass(keyed.table))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has inheritance children, whose rows these reads would not see",
						RelationGetRelationName(table))));
	if (TupleDescAttr(RelationGetDescr(table), keyed.column - 1)->atttypid != INT8ARRAYOID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" is not of type bigint[]", column)));
	keyed.key_index = find_key_index(table);
	table_close(table, NoLock);
	return keyed;
}

/*
 * resolve_uncached() through the backend's cache. Locking the named relation first takes in any
 * pending invalidation, so a hit is never older than the relation's current definition.
 */
static KeyedColumn resolve(Oid relation, const char *column)
{
	ResolvedColumn *entry;

	LockRelationOid(relation, AccessShareLock);
	for (int i = 0; i < resolved_count; i++)
	{
		entry = &resolved[i];
		if (entry->relation == relation && strcmp(NameStr(entry->column), column) == 0)
		{
			check_select(relation, GetUserId());
			if (OidIsValid(entry->view_owner))
				check_select(entry->keyed.table, entry->view_owner);
			return entry->keyed;
		}
	}
	{
		Oid			view_owner;
		KeyedColumn keyed = resolve_uncached(relation, column, &view_owner);

		/* Written only once resolved: an error above leaves every entry as it was. */
		entry = &resolved[resolved_next];
		entry->relation = relation;
		namestrcpy(&entry->column, column);
		entry->view_owner = view_owner;
		entry->keyed = keyed;
		resolved_next = (resolved_next + 1) % RESOLVED_SLOTS;
		resolved_count = Min(resolved_count + 1, RESOLVED_SLOTS);
		return keyed;
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
			if (!nulls[i])
				elements.values[elements.count++] = DatumGetInt64(datums[i]);
	}
	return elements;
}

static inline uint32 hash_int8(int64 value, uint32 mask)
{
	uint64		h = (uint64) value * UINT64CONST(0x9E3779B97F4A7C15);

	return (uint32) (h >> 32) & mask;
}

/*
 * The distinct values of `small` that `large` holds, in the order of `small`. A few values are
 * compared directly; otherwise an open-addressing set of `small` (at most half full) is probed with
 * each value of `large`, marking what it finds.
 */
static ArrayType *intersect(Int8Elements small, Int8Elements large)
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
				if (large.values[j] == small.values[i])
				{
					common[found++] = Int64GetDatum(small.values[i]);
					break;
				}
		}
	}
	else
	{
		uint32		size = 16;
		int64	   *slots;
		uint8	   *state;		/* 0 empty, 1 holds a value, 2 holds a value `large` has too */

		while (size < (uint32) small.count * 2)
			size <<= 1;
		slots = palloc(sizeof(int64) * size);
		state = palloc0(size);
		for (int i = 0; i < small.count; i++)
		{
			uint32		at = hash_int8(small.values[i], size - 1);

			while (state[at] != 0 && slots[at] != small.values[i])
				at = (at + 1) & (size - 1);
			slots[at] = small.values[i];
			state[at] = 1;
		}
		for (int j = 0; j < large.count; j++)
		{
			uint32		at = hash_int8(large.values[j], size - 1);

			while (state[at] != 0 && slots[at] != large.values[j])
				at = (at + 1) & (size - 1);
			if (state[at] == 1)
				state[at] = 2;
		}
		for (int i = 0; i < small.count; i++)
		{
			uint32		at = hash_int8(small.values[i], size - 1);

			while (slots[at] != small.values[i])
				at = (at + 1) & (size - 1);
			if (state[at] == 2)
			{
				common[found++] = Int64GetDatum(small.values[i]);
				state[at] = 3;	/* a repeated value of `small` is given once */
			}
		}
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
