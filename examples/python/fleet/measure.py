"""Measure the fleet's re-own time after a worker's SIGKILL: RUNS runs
without and RUNS with a leader kill, alternating, on one three-server
cluster built from this tree; prints each run and the medians.

    /usr/bin/python3 examples/python/fleet/measure.py [RUNS] [TTL]"""

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_run import run_once  # noqa: E402
from servers import Cluster  # noqa: E402


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    ttl = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    c = Cluster(3).start()
    res = {False: [], True: []}
    try:
        for i in range(runs):
            for lk in (False, True):
                r = run_once(c, 100 + 2 * i + lk, leader_kill=lk, ttl=ttl)
                res[lk].append(r["reown_s"])
                print(f"run {i + 1} {'leader kill' if lk else 'worker only'}: re-own {r['reown_s']:.3f}s "
                      f"(first camera {r['first_reown_s']:.3f}s), restarted workers {r['respawns']}", flush=True)
    finally:
        c.stop()
    for lk in (False, True):
        v = res[lk]
        print(f"{'with leader kill' if lk else 'worker SIGKILL only'}: median {statistics.median(v):.3f}s, "
              f"min {min(v):.3f}s, max {max(v):.3f}s over {len(v)} runs (session TTL {ttl}s, tick 20ms)")


if __name__ == "__main__":
    main()
