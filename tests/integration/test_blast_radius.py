"""The blast radius of a bad event or a broken view: the stream or view it hits, and nothing else.

Ten streams in one runner; the first receives poison events all along and has one of its views
broken halfway (loadgen/blast_radius/scenario.py, the same scenario as the benchmark, shorter). The
other nine stay exact and fresh throughout; the first counts every event but the poison, which
is dead-lettered once each; the broken view is quarantined. Freshness is printed, and only a stall
fails the test (the machine is shared: the figure itself is the benchmark's to report).
"""

from __future__ import annotations

from loadgen.blast_radius.scenario import run
from pipelines.settings import PostgresSettings

STALL_S = 10.0  # far above any batch: what the old runner did was stall every stream for good


def test_poison_and_a_broken_view_in_one_stream_leave_the_nine_others_exact_and_flowing(stack, kafka, secrets_dir):
    postgres = PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=secrets_dir)
    result = run(streams=10, seconds=15, rate=50, postgres=postgres, kafka=kafka)

    print(
        f"bystanders' freshness p50 {result.percentile(0.5):.2f} s, p99 {result.percentile(0.99):.2f} s,"
        f" max {max(result.freshness_s):.2f} s over {len(result.freshness_s)} samples"
    )
    assert result.exact, (result.events, result.counted, result.poison, result.dead_letters)
    assert result.poison["overflow"] >= 5
    assert result.poison["zero"] >= 5
    assert [view.rsplit(".", 1)[1] for view in result.quarantined] == ["joined"]
    assert len(result.freshness_s) > 50
    assert max(result.freshness_s) < STALL_S
