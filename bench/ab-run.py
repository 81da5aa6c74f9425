#!/usr/bin/env python3
"""A/B of two `mayfly` binaries on a daemonless `mayfly run -- /bin/true`.

    python3 bench/ab-run.py OLD_BINARY NEW_BINARY [PAIRS]

Runs the two binaries alternately (the first of each pair alternates too),
each with its own state directory, and after every run waits until that
run's reaper has removed the sandbox (its directories and cgroups) and
exited, so that
neither binary is timed while the other's cleanup runs. Prints both medians
and the median of the per-pair ratios NEW/OLD, which cancels noise that hit
both. Run as root, on an otherwise idle host; see docs/BENCHMARKS.md for
why a quiet filesystem matters on these hosts.
"""
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time


def reapers():
    """The /proc directories of the reapers alive now."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"mayfly-reaper"):
                    found.append(f"/proc/{pid}")
        except OSError:
            pass
    return found


def alive(proc_dir):
    """A zombie is not: it holds only its pid until the host's init reaps it."""
    try:
        with open(f"{proc_dir}/stat") as f:
            return not f.read().rsplit(")", 1)[1].strip().startswith("Z")
    except OSError:
        return False


def wait_clean(state, limit=10.0):
    start = time.perf_counter()
    running = reapers()
    while time.perf_counter() - start < limit:
        left = os.listdir(f"{state}/sandboxes") + os.listdir(f"{state}/trash")
        cgroups = glob.glob("/sys/fs/cgroup/*/mayfly/mf-*") + glob.glob("/sys/fs/cgroup/mayfly/mf-*")
        if not left and not cgroups and not any(alive(p) for p in running):
            return
        time.sleep(0.0002)
    sys.exit(f"the sandbox of a run in {state} was not cleaned up within {limit} s")


def timed(binary, state):
    start = time.perf_counter()
    # Spare namespaces stay in the state directory, not the host's.
    env = dict(os.environ, MAYFLY_SPARE_NS_DIR=f"{state}/spare-ns")
    out = subprocess.run([binary, "--state-dir", state, "run", "--", "/bin/true"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    took = (time.perf_counter() - start) * 1e3
    if out.returncode != 0:
        sys.exit(f"{binary} failed: {out.stderr.decode(errors='replace')}")
    wait_clean(state)
    return took


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 120
    with tempfile.TemporaryDirectory(prefix="mayfly-ab-") as tmp:
        states = {old: f"{tmp}/old", new: f"{tmp}/new"}
        for b in (old, new):  # warm up: first run of each makes its state directory
            timed(b, states[b])
        times = {old: [], new: []}
        for i in range(pairs):
            order = (old, new) if i % 2 == 0 else (new, old)
            for b in order:
                times[b].append(timed(b, states[b]))
                time.sleep(0.01)
        for state in states.values():
            for f in glob.glob(f"{state}/spare-ns/*"):
                subprocess.run(["umount", "-l", f], stderr=subprocess.DEVNULL)
    med = statistics.median
    ratio = med([n / o for o, n in zip(times[old], times[new])])
    print(f"old p50 {med(times[old]):.2f} ms, new p50 {med(times[new]):.2f} ms, "
          f"new/old per-pair median {ratio:.3f} ({pairs} pairs)")


if __name__ == "__main__":
    main()
