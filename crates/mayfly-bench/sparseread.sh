#!/bin/bash
# usage: sparseread.sh BIN_DIR LABEL  (BIN_DIR holds mayfly and mayflyd; run as root)
# A sandbox makes a 1000 MiB file that is all hole (`truncate -s`), on the default state
# directory (ext4 here, where reading a hole allocates and zeroes page cache). Reads it 5 times
# through GET /v1/sandboxes/{id}/files and packs it 5 times through GET .../archive, over the
# daemon's unix socket, and prints for each the median wall time, the daemon's CPU time per
# request (utime + stime of all its threads) and how much the host's page cache grew
# (docs/BENCHMARKS.md).
set -e
B=$1; L=$2; D=/tmp/mfs-$L; rm -rf $D; mkdir -p $D
$B/mayfly --socket $D/s.sock serve --state-dir $D/state --pool host=0 > $D/log 2>&1 &
for i in $(seq 100); do [ -S $D/s.sock ] && break; sleep 0.1; done
sleep 0.5
PID=$(pgrep -f "mayflyd --socket $D/s.sock serve")
ID=$($B/mayfly --socket $D/s.sock create --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
$B/mayfly --socket $D/s.sock exec $ID -- truncate -s 1000M /workspace/f >/dev/null
python3 - $D/s.sock $ID $L $PID <<'PY'
import os, socket, sys, time, statistics
sock, sid, label, pid = sys.argv[1:5]
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
def cached():
    for l in open("/proc/meminfo"):
        if l.startswith("Cached:"):
            return int(l.split()[1]) * 1024
for what, path in [("file read", "files"), ("tar download", "archive")]:
    walls, cpus, grew = [], [], []
    for i in range(5):
        os.system("sync; echo 1 > /proc/sys/vm/drop_caches")
        c0, m0 = cpu(), cached()
        s = socket.socket(socket.AF_UNIX); s.connect(sock)
        t = time.perf_counter()
        s.sendall(f"GET /v1/sandboxes/{sid}/{path}?path=/workspace/f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        n = 0
        while True:
            b = s.recv(1 << 20)
            if not b: break
            n += len(b)
        walls.append(time.perf_counter() - t); s.close()
        cpus.append(cpu() - c0); grew.append(cached() - m0)
        assert n > 1000 << 20, n
    print(f"{label} {what}, 1000 MiB hole: median {statistics.median(walls)*1e3:.0f} ms wall, "
          f"{statistics.median(cpus)*1e3:.0f} ms daemon CPU, page cache +{statistics.median(grew)/2**20:.0f} MiB")
PY
$B/mayfly --socket $D/s.sock rm $ID >/dev/null 2>&1 || true
kill $PID; sleep 1; rm -rf $D
