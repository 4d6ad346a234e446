"""A run's times as the benches read them (``bench_executor``, ``bench_quickstart``)."""


def world_size(version):
    """The ranks a reproducer version starts (its manifest's ``needs.world_size``; 1 when it declares none)."""
    return int(((version.manifest or {}).get("needs") or {}).get("world_size") or 1)


def own_seconds(run):
    """The reproducer's own time: first to last step record, all ranks; None without two timed records."""
    times = [record["time"] for record in run.step_records or ()
             if isinstance(record, dict) and isinstance(record.get("time"), (int, float))]
    return max(times) - min(times) if len(times) >= 2 else None
