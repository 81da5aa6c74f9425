#!/bin/bash
# usage: fileread.sh BIN_DIR LABEL  (BIN_DIR holds mayfly and mayflyd; run as root)
# Times 12 whole reads of a 256 MiB file through GET /v1/sandboxes/{id}/files over the
# daemon's unix socket and prints the median of the last 10 (docs/BENCHMARKS.md).
set -e
B=$1; L=$2; D=/tmp/mfr-$L; rm -rf $D; mkdir -p $D
$B/mayfly --socket $D/s.sock serve --state-dir $D/state --scratch /dev/shm/mfr-$L --pool host=0 > $D/log 2>&1 &
for i in $(seq 100); do [ -S $D/s.sock ] && break; sleep 0.1; done
sleep 0.5
ID=$($B/mayfly --socket $D/s.sock create --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
$B/mayfly --socket $D/s.sock exec $ID -- sh -c 'head -c 268435456 /dev/urandom > /workspace/f' >/dev/null
python3 - $D/s.sock $ID $L <<'PY'
import socket, sys, time, statistics
sock, sid, label = sys.argv[1:4]
ts=[]
for i in range(12):
    s=socket.socket(socket.AF_UNIX); s.connect(sock)
    t=time.perf_counter()
    s.sendall(f"GET /v1/sandboxes/{sid}/files?path=/workspace/f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    n=0
    while True:
        b=s.recv(1<<20)
        if not b: break
        n+=len(b)
    ts.append(time.perf_counter()-t); s.close()
    assert n > 268435456, n
ts=ts[2:]
print(label, "256 MiB read: median %.1f ms, min %.1f, max %.1f" % (statistics.median(ts)*1e3, min(ts)*1e3, max(ts)*1e3))
PY
$B/mayfly --socket $D/s.sock rm $ID >/dev/null 2>&1 || $B/mayfly --socket $D/s.sock destroy $ID >/dev/null 2>&1 || true
pkill -f "mayflyd --socket $D/s.sock serve" || true
sleep 1
