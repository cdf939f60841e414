#!/usr/bin/env python3
"""Checks a ckptd metrics file (--metrics_file) with Prometheus's own parser.

Usage: check_metrics.py FILE --version V --saved-bytes N --loaded-bytes N
                        --failed-load-code CODE [--stopped]

Parses FILE with prometheus_client's text-format parser (the format
node_exporter's textfile collector reads) and checks, after one committed
save of N bytes, one load of M bytes and one load that failed with CODE:
  - every documented family is there, with its type (docs/OPERATIONS.md,
    "Metrics"), and nothing else with the ckptd_ prefix;
  - the counters moved by the right amounts: one committed save, no failed
    or cancelled one, one load ok and one failed, bytes staged and written
    at least N, bytes read from storage at least M, none from memory (the
    tier is off), and exactly one error, of CODE;
  - each histogram's buckets are cumulative and end in +Inf == _count, and
    the counts are one per save phase and two loads;
  - the gauges are sane (pool and tier sizes, nothing in flight);
  - ckptd_build_info carries V, ckptd_start_time_seconds is recent.
With --stopped (the file the daemon wrote last, at stop): no session and
no connection is open any more.

Exit status: 0 if every check passes, 1 if any fails (each printed as
"ERROR: ..."), 2 on bad usage or a file that does not parse.
"""

import argparse
import math
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

# Family name as the parser reports it (counters without _total) -> type.
EXPECTED = {
    "ckptd_saves": "counter",
    "ckptd_saves_in_flight": "gauge",
    "ckptd_loads": "counter",
    "ckptd_staged_bytes": "counter",
    "ckptd_written_bytes": "counter",
    "ckptd_read_bytes": "counter",
    "ckptd_save_call_seconds": "histogram",
    "ckptd_save_staged_seconds": "histogram",
    "ckptd_save_durable_seconds": "histogram",
    "ckptd_save_committed_seconds": "histogram",
    "ckptd_load_seconds": "histogram",
    "ckptd_staging_pool_used_bytes": "gauge",
    "ckptd_staging_pool_size_bytes": "gauge",
    "ckptd_staging_pool_withheld_bytes": "gauge",
    "ckptd_gpu_saves_held": "gauge",
    "ckptd_memory_tier_used_bytes": "gauge",
    "ckptd_memory_tier_budget_bytes": "gauge",
    "ckptd_sessions": "gauge",
    "ckptd_connections": "gauge",
    "ckptd_io_queue_depth": "gauge",
    "ckptd_start_time_seconds": "gauge",
    "ckptd_errors": "counter",
    "ckptd_build_info": "gauge",
    "ckptd_remote_uploads": "counter",
    "ckptd_remote_uploaded_bytes": "counter",
    "ckptd_remote_retries": "counter",
    "ckptd_remote_deleted": "counter",
    "ckptd_remote_backlog": "gauge",
}

STATUS_CODES = [
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]

errors = []


def check(condition, message):
    if not condition:
        errors.append(message)
        print(f"ERROR: {message}")


def samples(families, family, name=None, **labels):
    """Values of `family`'s samples named `name` (default: any) with `labels`."""
    out = []
    for s in families[family].samples:
        if name is not None and s.name != name:
            continue
        if all(s.labels.get(k) == v for k, v in labels.items()):
            out.append(s.value)
    return out


def value(families, family, name=None, **labels):
    found = samples(families, family, name, **labels)
    check(len(found) == 1, f"{family}{labels}: {len(found)} samples, expected one")
    return found[0] if found else math.nan


def check_histogram(families, family, expected_count):
    buckets = [(s.labels["le"], s.value) for s in families[family].samples
               if s.name == family + "_bucket"]
    check(buckets, f"{family}: no buckets")
    if not buckets:
        return
    check(buckets[-1][0] == "+Inf", f"{family}: last bucket is le={buckets[-1][0]}")
    bounds = [float(le) for le, _ in buckets]
    check(bounds == sorted(bounds), f"{family}: bucket bounds not ascending")
    counts = [v for _, v in buckets]
    check(counts == sorted(counts), f"{family}: buckets not cumulative: {counts}")
    count = value(families, family, family + "_count")
    check(counts[-1] == count, f"{family}: +Inf bucket {counts[-1]} != _count {count}")
    check(count == expected_count, f"{family}: _count {count}, expected {expected_count}")
    total = value(families, family, family + "_sum")
    check(total >= 0 and (count > 0 or total == 0), f"{family}: _sum {total}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--version", required=True)
    parser.add_argument("--saved-bytes", type=int, required=True)
    parser.add_argument("--loaded-bytes", type=int, required=True)
    parser.add_argument("--failed-load-code", required=True)
    parser.add_argument("--stopped", action="store_true")
    args = parser.parse_args()

    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as e:  # the parser raises plain ValueErrors and others
        print(f"ERROR: {args.file} does not parse: {e}")
        return 2
    print(f"{args.file}: {len(families)} families")

    for name, typ in EXPECTED.items():
        check(name in families, f"family {name} missing")
        if name in families:
            check(families[name].type == typ,
                  f"{name} is a {families[name].type}, expected {typ}")
            check(families[name].documentation, f"{name} has no HELP text")
    extra = sorted(set(n for n in families if n.startswith("ckptd_")) - set(EXPECTED))
    check(not extra, f"undocumented families: {extra}")
    if any(name not in families for name in EXPECTED):
        return 1

    # Counters.
    check(value(families, "ckptd_saves", outcome="committed") == 1, "committed saves != 1")
    check(value(families, "ckptd_saves", outcome="failed") == 0, "failed saves != 0")
    check(value(families, "ckptd_saves", outcome="cancelled") == 0, "cancelled saves != 0")
    check(value(families, "ckptd_loads", outcome="ok") == 1, "loads ok != 1")
    check(value(families, "ckptd_loads", outcome="failed") == 1, "loads failed != 1")
    staged = value(families, "ckptd_staged_bytes")
    written = value(families, "ckptd_written_bytes")
    check(staged >= args.saved_bytes, f"staged {staged} < saved {args.saved_bytes}")
    check(written >= args.saved_bytes, f"written {written} < saved {args.saved_bytes}")
    read_storage = value(families, "ckptd_read_bytes", source="storage")
    check(read_storage >= args.loaded_bytes,
          f"read from storage {read_storage} < loaded {args.loaded_bytes}")
    check(value(families, "ckptd_read_bytes", source="memory") == 0,
          "read from memory though the tier is off")
    for code in STATUS_CODES:
        expected = 1 if code == args.failed_load_code else 0
        check(value(families, "ckptd_errors", code=code) == expected,
              f"ckptd_errors_total{{code={code}}} != {expected}")
    check(len(samples(families, "ckptd_errors", "ckptd_errors_total")) == len(STATUS_CODES),
          "ckptd_errors_total: not one series per status code")

    # Histograms: one save through every phase, two loads.
    check_histogram(families, "ckptd_save_call_seconds", 1)
    check_histogram(families, "ckptd_save_staged_seconds", 1)
    check_histogram(families, "ckptd_save_durable_seconds", 1)
    check_histogram(families, "ckptd_save_committed_seconds", 1)
    check_histogram(families, "ckptd_load_seconds", 2)
    staged_s = value(families, "ckptd_save_staged_seconds", "ckptd_save_staged_seconds_sum")
    committed_s = value(families, "ckptd_save_committed_seconds",
                        "ckptd_save_committed_seconds_sum")
    check(staged_s <= committed_s, f"STAGED after COMMITTED: {staged_s} > {committed_s}")

    # Gauges.
    size = value(families, "ckptd_staging_pool_size_bytes")
    used = value(families, "ckptd_staging_pool_used_bytes")
    check(size > 0, f"staging pool size {size}")
    check(0 <= used <= size, f"staging pool used {used} of {size}")
    check(value(families, "ckptd_staging_pool_withheld_bytes") == 0, "buffers withheld")
    check(value(families, "ckptd_gpu_saves_held") == 0, "GPU saves held")
    check(value(families, "ckptd_memory_tier_budget_bytes") == 0, "tier budget != 0")
    check(value(families, "ckptd_memory_tier_used_bytes") == 0, "tier used != 0")
    check(value(families, "ckptd_saves_in_flight") == 0, "saves still in flight")
    check(value(families, "ckptd_io_queue_depth") == 0, "I/O still in flight")
    sessions = value(families, "ckptd_sessions")
    connections = value(families, "ckptd_connections")
    if args.stopped:
        check(sessions == 0, f"{sessions} sessions open after stop")
        check(connections == 0, f"{connections} connections open after stop")
    else:
        check(sessions == 1, f"{sessions} sessions open, expected the test's one")
        check(connections >= 1, f"{connections} connections open, expected >= 1")
    check(value(families, "ckptd_build_info", version=args.version) == 1,
          f"ckptd_build_info{{version={args.version}}} != 1")
    started = value(families, "ckptd_start_time_seconds")
    check(time.time() - 600 < started <= time.time() + 1,
          f"start time {started} is not within the last 10 minutes")

    print("ok" if not errors else f"{len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
