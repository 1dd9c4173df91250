"""friends_who_like on the typical mix and on the heavy tail, side by side with the seed and a PK read.

The seed answers "which of my friends like this object" with `unnest ... INTERSECT` over two arrays:
fine for a handful of likers, slow when a user follows thousands and the object has thousands of
likers. One run (`loadgen.friends.data` builds the state through the engine in a throwaway schema)
measures, for each mix, with pgbench (`-M prepared`, as `sv_reader`, `--clients` sessions):

- `before`: `friends_who_like` as it was before this benchmark (kept in `loadgen.friends.data`);
- `seed`: the seed's test3 statement, `array_intersect` over its own tables (the same arrays);
- `now`: `friends_who_like` of sql/functions/social.sql as checked out;
- `pk_read`: `SELECT like_cnt FROM obj WHERE id = :id`, a plain primary-key read of the same object.

Besides calls/s, the server's own CPU per call (`measure_cpu`: each statement in a PL/pgSQL loop in
one backend, its CPU time from /proc) compares the queries' cost apart from the shared machine's load.

Runs alternate (round by round, every query of a mix in turn), so a busy spell of the shared machine
lands on all of them. calls/s, p50 and p99 (from pgbench's per-transaction log) are medians over
the rounds; the notes give the median of the ratios within each round beside them (BENCHMARKS.md
divides the medians). Before timing, each function's answers are compared, as sets, with the
seed's on sample pairs of both mixes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from loadgen.common import cli
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import percentile
from loadgen.common.postgres import PGBENCH, owner_conninfo, pgbench_available, pgbench_env, pgbench_run
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.friends.data import FriendsShape, FriendsState, friends_state
from loadgen.workloads.social import WorkloadSettings, new_rng, pgbench_gaussian
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, PostgresSettings

log = get_logger("loadgen.friends")

# What each mix draws: objects and users of the typical mix (as the social benchmark's queries run), or of
# the heavy tail (ids after the typical ones, see loadgen.friends.data).
MIXES = {
    "typical": "\\set id random_gaussian(1, :objects, {gaussian})\n\\set uid random(1, :followers)\n",
    "heavy": "\\set id :objects + random(1, :heavy_objects)\n\\set uid :followers + random(1, :heavy_users)\n",
}
# In the order timed within a round: each compared pair (now and seed, now and pk_read) back to back.
QUERIES = {
    "before": "SELECT {s}.friends_who_like_before(:uid, :id);",
    "seed": "SELECT {s}.array_intersect(t1.who_like, t2.like_who)"
    " FROM (SELECT who_like FROM {s}.obj WHERE id = :id) t1,"
    " (SELECT array[like_who] AS like_who FROM {s}.user_like_agg WHERE uid = :uid) t2;",
    "now": "SELECT {s}.friends_who_like(:uid, :id);",
    "pk_read": "SELECT like_cnt FROM {s}.obj WHERE id = :id;",
}
# The targets: numerator / denominator at least this.
TARGETS = {"heavy": ("now", "seed", 3.0), "typical": ("now", "pk_read", 0.9)}
SAMPLE_PAIRS = 60  # pairs per mix whose answers are compared with the seed's before timing


@dataclass(frozen=True)
class Timing:
    """One query of one mix in one round."""

    mix: str
    query: str
    round: int
    calls_per_second: float
    p50_ms: float
    p99_ms: float
    calls: int


def draw_pairs(state: FriendsState, mix: str, count: int, seed: int) -> list[tuple[int, int]]:
    """`count` (uid, oid) pairs drawn as the mix's pgbench script draws them, the same for a given seed."""
    shape, rng = state.shape, new_rng(seed)
    if mix == "typical":
        w = shape.workload
        return [
            (rng.randint(1, shape.followers), pgbench_gaussian(rng, 1, shape.objects, w.gaussian)) for _ in range(count)
        ]
    return [
        (shape.followers + rng.randint(1, shape.heavy_users), shape.objects + rng.randint(1, shape.heavy_objects))
        for _ in range(count)
    ]


def check_answers(state: FriendsState, postgres: PostgresSettings, functions: Sequence[str]) -> dict[str, int]:
    """Compare each function's answer with the seed's, as sets, on sample pairs of each mix; count the pairs.

    Raises:
        BenchmarkError: some answer differs, naming the function and the pair.
    """
    pairs = {mix: draw_pairs(state, mix, SAMPLE_PAIRS, seed=7) for mix in MIXES}
    s = sql.Identifier(state.schema)
    seed_query = sql.SQL(
        "SELECT coalesce({s}.array_intersect(o.who_like, u.like_who), '{{}}')"
        " FROM (SELECT (SELECT who_like FROM {s}.obj WHERE id = %(oid)s) AS who_like) AS o,"
        " (SELECT (SELECT like_who FROM {s}.user_like_agg WHERE uid = %(uid)s) AS like_who) AS u"
    ).format(s=s)
    checked = {}
    with psycopg.connect(postgres.conninfo(user=ROLE_READER, application_name="streamviews-bench-check")) as conn:
        for mix, draws in pairs.items():
            for uid, oid in draws:
                expected = sorted(conn.execute(seed_query, {"uid": uid, "oid": oid}).fetchone()[0])
                for function in functions:
                    call = sql.SQL("SELECT {}.{}(%s, %s)").format(s, sql.Identifier(function))
                    got = conn.execute(call, (uid, oid)).fetchone()[0]
                    if sorted(got) != expected or len(set(got)) != len(got):
                        raise BenchmarkError(f"{function}({uid}, {oid}) = {sorted(got)[:10]}, seed: {expected[:10]}")
            checked[mix] = len(draws)
    return checked


def measure(
    state: FriendsState,
    queries: Mapping[str, str],
    *,
    seconds: int,
    rounds: int,
    clients: int,
    postgres: PostgresSettings,
) -> list[Timing]:
    """Every query of every mix, `rounds` times, alternating; each timing logged as it comes."""
    shape = state.shape
    env = pgbench_env(ROLE_READER, postgres)
    variables = {
        "objects": shape.objects,
        "followers": shape.followers,
        "heavy_objects": shape.heavy_objects,
        "heavy_users": shape.heavy_users,
    }
    s = sql.Identifier(state.schema)
    timings = []
    for round_ in range(1, rounds + 1):
        for mix, draws in MIXES.items():
            for query, statement in queries.items():
                script = draws.format(gaussian=shape.workload.gaussian) + sql.SQL(statement).format(s=s).as_string()
                tps, latencies = pgbench_run(
                    script + "\n",
                    seconds,
                    clients,
                    threads=min(clients, 2),
                    env=env,
                    variables=variables,
                    latencies=True,
                )
                timing = Timing(
                    mix, query, round_, tps, percentile(latencies, 50), percentile(latencies, 99), len(latencies)
                )
                log.info("timed", **asdict(timing))
                timings.append(timing)
    return timings


# Calls per mix when timing the server's CPU: each takes a few µs (typical) or ms (heavy tail).
CPU_CALLS = {"typical": 20_000, "heavy": 300}


def backend_cpu_ns(pid: int) -> int | None:
    """CPU time a backend has used, in ns (/proc/<pid>/schedstat); None when the server is not on this machine."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def measure_cpu(state: FriendsState, queries: Mapping[str, str], postgres: PostgresSettings) -> dict[str, dict]:
    """Server CPU per call of each query, in µs: its statement run in a PL/pgSQL loop in one backend.

    Throughput on a shared 2-core machine moves with whatever else runs; the CPU time the backend
    itself spent (schedstat) moves far less, so these figures compare the queries' own cost. They
    leave out what each call through pgbench adds (protocol, its own transaction, taking the locks
    again). Each query runs 100 times to warm up, then `CPU_CALLS[mix]` times over the mix's draws
    (as the owner, in a function of the bench schema). Empty when the server's processes cannot be
    read from here.
    """
    s = sql.Identifier(state.schema)
    cpu: dict[str, dict] = {}
    with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if backend_cpu_ns(pid) is None:
            return {}
        for query, statement in queries.items():
            body = statement.replace("SELECT ", "PERFORM ", 1).replace(":uid", "uids[k]").replace(":id", "oids[k]")
            loop = sql.SQL(
                "CREATE FUNCTION {s}.{name}(uids bigint[], oids bigint[]) RETURNS void LANGUAGE plpgsql AS $$"
                " BEGIN FOR k IN 1..cardinality(oids) LOOP " + body + " END LOOP; END $$"
            ).format(s=s, name=sql.Identifier(f"cpu_{query}"))
            conn.execute(loop)
        for mix in MIXES:
            uids, oids = (list(ids) for ids in zip(*draw_pairs(state, mix, CPU_CALLS[mix], seed=11), strict=True))
            for query in queries:
                call = sql.SQL("SELECT {}.{}(%s, %s)").format(s, sql.Identifier(f"cpu_{query}"))
                conn.execute(call, (uids[:100], oids[:100]))  # plans cached, pages read
                before = backend_cpu_ns(pid) or 0
                conn.execute(call, (uids, oids))
                used = (backend_cpu_ns(pid) or 0) - before
                cpu.setdefault(mix, {})[query] = used / 1000 / len(oids)
                log.info("server cpu", mix=mix, query=query, us_per_call=round(used / 1000 / len(oids), 2))
    return cpu


def summarize(timings: Sequence[Timing]) -> dict[str, dict[str, dict]]:
    """Per mix and query, in the order timed: medians over the rounds, each round's calls/s, and the ratios.

    A ratio is the median over the rounds of the ratio within each round (`vs_seed`, `vs_pk_read`):
    the two sides of a round ran seconds apart, so a busy spell of the shared machine weighs on both.
    """
    by_key = {(t.mix, t.query, t.round): t.calls_per_second for t in timings}
    summary: dict[str, dict[str, dict]] = {}
    for mix, query in dict.fromkeys((t.mix, t.query) for t in timings):
        runs = [t for t in timings if (t.mix, t.query) == (mix, query)]
        figures: dict = {
            "calls_per_second": statistics.median(t.calls_per_second for t in runs),
            "p50_ms": statistics.median(t.p50_ms for t in runs),
            "p99_ms": statistics.median(t.p99_ms for t in runs),
            "rounds": [round(t.calls_per_second) for t in runs],
        }
        for base in ("seed", "pk_read"):
            ratios = [t.calls_per_second / by_key[mix, base, t.round] for t in runs if by_key.get((mix, base, t.round))]
            figures[f"vs_{base}"] = statistics.median(ratios) if ratios else None
        summary.setdefault(mix, {})[query] = figures
    return summary


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def mix_notes(summary: dict[str, dict[str, dict]], state: FriendsState) -> list[str]:
    """One table per mix: calls/s, p50/p99, the ratios to the seed and to the PK read, server CPU per call."""
    lines = []
    for mix, figures in summary.items():
        sizes = state.sizes[mix]
        lines.append(
            f"{mix}: {sizes['likers_rows']:,.0f} objects, likers p50/p99/max {sizes['likers_p50']:,.0f}"
            f"/{sizes['likers_p99']:,.0f}/{sizes['likers_max']:,.0f}; {sizes['following_rows']:,.0f} users,"
            f" following p50/p99/max {sizes['following_p50']:,.0f}/{sizes['following_p99']:,.0f}"
            f"/{sizes['following_max']:,.0f}"
        )
        for query, f in figures.items():
            rounds = ", ".join(f"{r:,}" for r in f["rounds"])
            cpu = f"{f['server_us_per_call']:,.1f}" if f.get("server_us_per_call") is not None else "-"
            lines.append(
                f"{mix} {query}: {f['calls_per_second']:,.0f} calls/s, p50 {f['p50_ms']:.3f} ms, within-round"
                f" ratio to the seed {_ratio(f['vs_seed'])}, to the PK read {_ratio(f['vs_pk_read'])}; server"
                f" {cpu} µs a call; calls/s by round {rounds}"
            )
    return lines


def result_of(summary: dict[str, dict[str, dict]]) -> tuple[Results, list, list[Comparison]]:
    """Calls/s and p99 of each mix and query; each compared pair, with the issue's targets where it has one."""
    results, rows, comparisons = Results(), [], []
    for mix, queries in summary.items():
        for query, f in queries.items():
            key = f"{mix}_{query}"
            results.values |= {key: f["calls_per_second"], f"{key}_p99": f["p99_ms"]}
            rows += [(f"{mix}: {query} (calls/s)", key), (f"{mix}: {query} p99 (ms)", f"{key}_p99", ".3f")]
        for numerator, denominator in (("now", "seed"), ("now", "pk_read"), ("before", "seed")):
            if numerator in queries and denominator in queries:
                target = TARGETS.get(mix)
                minimum = target[2] if target and target[:2] == (numerator, denominator) else None
                comparisons.append(
                    Comparison(
                        f"{mix}: {numerator} / {denominator}", f"{mix}_{numerator}", f"{mix}_{denominator}", minimum
                    )
                )
    return results, rows, comparisons


def run(args: argparse.Namespace) -> BenchResult:
    """The state, the answers checked, server CPU, the alternating rounds; the figures of every mix."""
    postgres = PostgresSettings()
    shape = FriendsShape(args.likes, args.followers, args.heavy_objects, args.heavy_users, WorkloadSettings())
    log.info("start", **{k: str(v) for k, v in vars(args).items()})
    if not pgbench_available():
        raise BenchmarkError(f"pgbench not found at {PGBENCH} (set PGBENCH)")
    with friends_state(shape, postgres) as state:
        functions = ["friends_who_like_before", "friends_who_like"]
        checked = check_answers(state, postgres, functions)
        log.info("answers agree with the seed's", pairs=checked, functions=functions)
        cpu = measure_cpu(state, QUERIES, postgres)
        timings = measure(
            state, QUERIES, seconds=args.seconds, rounds=args.rounds, clients=args.clients, postgres=postgres
        )
    summary = summarize(timings)
    for mix, figures in summary.items():
        for query, f in figures.items():
            f["server_us_per_call"] = cpu.get(mix, {}).get(query)
    header = [
        f"friends_who_like benchmark ({machine_line(postgres)}; pgbench -M prepared -c {args.clients}"
        f" -j {min(args.clients, 2)} -T {args.seconds} x {args.rounds} rounds, alternating; state loaded through"
        f" the engine: {state.load_changes:,} changes in {state.load_seconds:.0f}s)"
    ]
    results, rows, comparisons = result_of(summary)
    pairs = ", ".join(f"{n} {mix} pairs" for mix, n in checked.items())
    return BenchResult.of(
        "friends",
        results,
        rows,
        comparisons=comparisons,
        header=header,
        notes=[
            f"the answers of {', '.join(functions)} equal the seed's, as sets, on {pairs}",
            *mix_notes(summary, state),
        ],
        extra={
            "shape": {k: v for k, v in asdict(shape).items() if k != "workload"} | {"objects": shape.objects},
            "sizes": state.sizes,
            "summary": summary,
            "timings": [asdict(t) for t in timings],
        },
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.friends`."""
    defaults = FriendsShape()
    parser = cli.parser(__doc__)
    parser.add_argument("--seconds", type=int, default=4, help="each pgbench run")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every query")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients (threads: at most 2)")
    parser.add_argument("--likes", type=int, default=defaults.likes, help="typical like events")
    parser.add_argument("--followers", type=int, default=defaults.followers, help="users with long-tail lists")
    parser.add_argument("--heavy-objects", type=int, default=defaults.heavy_objects, help="objects of the heavy tail")
    parser.add_argument("--heavy-users", type=int, default=defaults.heavy_users, help="users of the heavy tail")
    return cli.run(parser, run, "loadgen.friends", argv)


if __name__ == "__main__":
    sys.exit(main())
