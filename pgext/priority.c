/*
 * priority.c: streamviews.lower_backend_priority(nice): the calling backend lowers its own CPU priority.
 *
 * A view's backfill decodes history in a child process of the stream runner niced below the live
 * loop (pipelines/cv/backfill_process.py), but the SQL each of its batches runs is the work of its
 * PostgreSQL backend, which the postmaster forked at the normal priority: on two cores it competed
 * with the live runner's backend as an equal and the live views' freshness paid for it. Only the
 * backend can nice itself (another process would need privilege over it), so the backfill asks its
 * own backend to, once per connection, with the child's nice value.
 *
 * Raising one's own nice value is always allowed, without privilege and in a container too; lowering
 * it back needs CAP_SYS_NICE, so the function only ever raises it. The value holds for the backend's
 * life, i.e. its connection's (PostgreSQL forks a backend per connection; behind a connection pooler
 * it would outlive the client, hence EXECUTE only for the roles that run backfills). Parallel workers
 * are forked by the postmaster and are not niced: the backfill's statements do not use them.
 */
#include "postgres.h"

#include <errno.h>
#include <sys/resource.h>

#include "fmgr.h"

#define NICE_MIN 0
#define NICE_MAX 19

static int
current_nice(void)
{
	int			nice;

	errno = 0;					/* getpriority may return -1 as a value: errno tells a failure */
	nice = getpriority(PRIO_PROCESS, 0);
	if (nice == -1 && errno != 0)
		ereport(ERROR, (errcode(ERRCODE_SYSTEM_ERROR), errmsg("lower_backend_priority: getpriority failed: %m")));
	return nice;
}

PG_FUNCTION_INFO_V1(sv_lower_backend_priority);

/*
 * lower_backend_priority(p_nice integer) RETURNS integer: this backend's nice value raised to p_nice
 * (0..19) when it is lower, never lowered; the nice value now in effect.
 */
Datum
sv_lower_backend_priority(PG_FUNCTION_ARGS)
{
	int32		wanted = PG_GETARG_INT32(0);

	if (wanted < NICE_MIN || wanted > NICE_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lower_backend_priority: nice value %d is out of range %d..%d", wanted, NICE_MIN, NICE_MAX)));
	if (current_nice() < wanted && setpriority(PRIO_PROCESS, 0, wanted) != 0)
		ereport(ERROR, (errcode(ERRCODE_SYSTEM_ERROR), errmsg("lower_backend_priority: setpriority failed: %m")));
	PG_RETURN_INT32(current_nice());
}
