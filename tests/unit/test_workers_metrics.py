"""``logrouter.workers.metrics``: the supervisor's page from the workers' pages, summed
and per worker. Pure text work."""

from __future__ import annotations

from logrouter.metrics import render_samples
from logrouter.workers.metrics import merge, parse


def page(*samples) -> str:
    return render_samples(iter(samples))


WORKER_0 = page(
    ("logrouter_batches_total", "counter", {}, 3),
    ("logrouter_source_bytes_total", "counter", {"source": "forward", "type": "fluent_forward"}, 200),
    ("logrouter_source_bytes_total", "counter", {"source": "other", "type": "fluent_forward"}, 10),
    ("logrouter_backlog_bytes", "gauge", {}, 1.5),
)
WORKER_1 = page(
    ("logrouter_batches_total", "counter", {}, 4),
    ("logrouter_source_bytes_total", "counter", {"source": "forward", "type": "fluent_forward"}, 50),
    ("logrouter_backlog_bytes", "gauge", {}, 2),
)


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def test_parse_reads_our_own_format() -> None:
    assert list(parse(WORKER_0)) == [
        ("logrouter_batches_total", "counter", "", 3.0),
        ("logrouter_source_bytes_total", "counter", 'source="forward",type="fluent_forward"', 200.0),
        ("logrouter_source_bytes_total", "counter", 'source="other",type="fluent_forward"', 10.0),
        ("logrouter_backlog_bytes", "gauge", "", 1.5),
    ]


def test_parse_skips_garbage() -> None:
    text = "\n".join(
        [
            "# HELP something text",
            "# TYPE good counter",
            "# TYPE broken",  # too few parts: no type recorded
            "",
            "good 5",
            "good{a=\"b\"} not-a-number",
            "just-one-word",
            "   ",
            "garbage line here",
            "untyped_one 2.5",
            'label_with_space{path="a b"} 7',
            "#comment 3",
        ]
    )
    assert list(parse(text)) == [
        ("good", "counter", "", 5.0),
        ("untyped_one", "untyped", "", 2.5),
        ("label_with_space", "untyped", 'path="a b"', 7.0),
    ]


def test_merge_sums_over_the_workers_only() -> None:
    """Only the sums: a page with per-worker series as well would make a PromQL sum()
    count every worker twice."""
    merged = merge({0: WORKER_0, 1: WORKER_1})
    assert lines_of(merged) == [
        "# TYPE logrouter_batches_total counter",
        "logrouter_batches_total 7",
        "# TYPE logrouter_source_bytes_total counter",
        'logrouter_source_bytes_total{source="forward",type="fluent_forward"} 250',
        'logrouter_source_bytes_total{source="other",type="fluent_forward"} 10',
        "# TYPE logrouter_backlog_bytes gauge",
        "logrouter_backlog_bytes 3.5",
    ]
    assert "worker=" not in merged
    assert merged.endswith("\n")


def test_merge_one_type_line_per_family() -> None:
    merged = merge({0: WORKER_0, 1: WORKER_1, 2: WORKER_1})
    types = [line for line in lines_of(merged) if line.startswith("# TYPE ")]
    assert types == [
        "# TYPE logrouter_batches_total counter",
        "# TYPE logrouter_source_bytes_total counter",
        "# TYPE logrouter_backlog_bytes gauge",
    ]
    assert "logrouter_batches_total 11" in lines_of(merged)


def test_merge_orders_workers_by_index() -> None:
    merged = merge({1: WORKER_1, 0: WORKER_0})
    assert lines_of(merged) == lines_of(merge({0: WORKER_0, 1: WORKER_1}))


def test_merge_a_family_only_one_worker_has() -> None:
    only_1 = page(("logrouter_reloads_total", "counter", {"result": "ok"}, 2))
    merged = lines_of(merge({0: WORKER_0, 1: only_1}))
    at = merged.index("# TYPE logrouter_reloads_total counter")
    assert merged[at + 1 :] == ['logrouter_reloads_total{result="ok"} 2']


def test_merge_appends_the_supervisors_own_samples() -> None:
    own = [
        ("logrouter_workers", "gauge", {}, 2),
        ("logrouter_worker_up", "gauge", {"worker": "0"}, 1),
        ("logrouter_worker_up", "gauge", {"worker": "1"}, 0),
    ]
    merged = merge({0: WORKER_0, 1: WORKER_1}, own)
    assert merged.endswith(render_samples(iter(own)))
    assert merged == merge({0: WORKER_0, 1: WORKER_1}) + render_samples(iter(own))
    assert lines_of(merged)[-5:] == [
        "# TYPE logrouter_workers gauge",
        "logrouter_workers 2",
        "# TYPE logrouter_worker_up gauge",
        'logrouter_worker_up{worker="0"} 1',
        'logrouter_worker_up{worker="1"} 0',
    ]


def test_merge_of_nothing() -> None:
    assert merge({}) == ""
    assert merge({0: "", 1: "garbage\n"}) == ""
    own = [("logrouter_workers", "gauge", {}, 3)]
    assert merge({}, own) == "# TYPE logrouter_workers gauge\nlogrouter_workers 3\n"


def test_merge_numbers() -> None:
    a = page(("x", "gauge", {}, 0.25), ("big", "counter", {}, 2**60), ("n", "counter", {}, 1.0))
    b = page(("x", "gauge", {}, 0.5), ("big", "counter", {}, 1), ("n", "counter", {}, 2.0))
    merged = lines_of(merge({0: a, 1: b}))
    assert "x 0.75" in merged
    assert "n 3" in merged  # integral floats print as integers
    big = [line for line in merged if line.startswith("big ")]
    assert len(big) == 1 and float(big[0].split()[1]) == float(2**60 + 1)


def test_merge_adds_only_the_counters_of_a_late_workers_last_page() -> None:
    """A worker that did not answer this scrape: its counters stay where they were (a sum
    going backwards reads as a reset), its gauges of then are left out."""
    merged = lines_of(merge({0: WORKER_0}, stale={1: WORKER_1}))
    assert "logrouter_batches_total 7" in merged
    assert 'logrouter_source_bytes_total{source="forward",type="fluent_forward"} 250' in merged
    assert "logrouter_backlog_bytes 1.5" in merged  # worker 0's gauge only
    assert merge({0: WORKER_0, 1: WORKER_1}, stale={1: WORKER_0}) == merge({0: WORKER_0, 1: WORKER_1})
