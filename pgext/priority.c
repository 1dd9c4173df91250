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
 *
 * Where the kernel groups processes by session for CPU fairness (CONFIG_SCHED_AUTOGROUP, on in
 * Debian's kernels and most others), a nice value weighs only against the other processes of the
 * same session: each session's group competes with the others as an equal. A backend is a session
 * of its own (PostgreSQL's InitPostmasterChild calls setsid), so its nice value alone changed
 * nothing; on such a machine a backend niced to 19 took as much CPU as the live runner's. So the
 * group's own nice value (/proc/self/autogroup) is raised as well, which is what weighs against the
 * other sessions: only when the backend leads its session, the group then being its alone.
 */
#include "postgres.h"

#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fmgr.h"
#include "miscadmin.h"

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

#define AUTOGROUP_FILE "/proc/self/autogroup"
#define AUTOGROUP_ATTEMPTS 10
#define AUTOGROUP_WAIT_US 110000

/*
 * The session's CPU group niced to `wanted` when it is lower and the group is this backend's alone.
 * No autogroups (another kernel, or not Linux): nothing to do. A failure to write is a warning: the
 * backend's own nice value is set, and the backfill goes on, slower to give way.
 */
static void
lower_autogroup(int wanted)
{
	FILE	   *file;
	int			current;
	bool		ok;

	if (getsid(0) != getpid())
		return;					/* a group shared with other processes: not ours to nice */
	file = fopen(AUTOGROUP_FILE, "r");
	if (file == NULL)
		return;
	ok = fscanf(file, "/autogroup-%*d nice %d", &current) == 1;
	fclose(file);
	if (!ok || current >= wanted)
		return;
	for (int attempt = 0;; attempt++)
	{
		file = fopen(AUTOGROUP_FILE, "w");
		ok = file != NULL && fprintf(file, "%d\n", wanted) > 0;
		if (file != NULL && fclose(file) != 0)
			ok = false;
		if (ok || errno != EAGAIN || attempt == AUTOGROUP_ATTEMPTS)
			break;
		/* Without CAP_SYS_ADMIN the kernel takes one such change per 100 ms, machine-wide. */
		CHECK_FOR_INTERRUPTS();
		pg_usleep(AUTOGROUP_WAIT_US);
	}
	if (!ok)
		ereport(WARNING,
				(errcode(ERRCODE_SYSTEM_ERROR),
				 errmsg("lower_backend_priority: cannot set the session's CPU group to nice %d: %m", wanted)));
}

PG_FUNCTION_INFO_V1(sv_lower_backend_priority);

/*
 * lower_backend_priority(p_nice integer) RETURNS integer: this backend's nice value raised to p_nice
 * (0..19) when it is lower, never lowered, and its session's CPU group's too; the nice value now in effect.
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
	lower_autogroup(wanted);
	PG_RETURN_INT32(current_nice());
}
