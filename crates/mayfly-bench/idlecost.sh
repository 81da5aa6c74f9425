#!/bin/bash
# usage: idlecost.sh BIN_DIR LABEL N  (BIN_DIR holds mayfly and mayflyd; run as root)
# Starts a daemon, creates N sandboxes, waits 3 s, then prints the daemon's CPU time
# (utime + stime, in 10 ms ticks) over 65 s of idling, which includes one of the disk
# watcher's once-a-minute measures of every sandbox (docs/BENCHMARKS.md).
set -e
B=$1; L=$2; N=$3; D=/tmp/mfi-$L; rm -rf $D; mkdir -p $D
$B/mayfly --socket $D/s.sock serve --state-dir $D/state --pool host=0 --gateway off > $D/log 2>&1 &
for i in $(seq 100); do [ -S $D/s.sock ] && break; sleep 0.1; done; sleep 0.5
PID=$(pgrep -f "mayflyd --socket $D/s.sock serve")
for i in $(seq $N); do $B/mayfly --socket $D/s.sock create --ttl 10m > /dev/null; done
sleep 3
T0=$(awk '{print $14+$15}' /proc/$PID/stat); sleep 65; T1=$(awk '{print $14+$15}' /proc/$PID/stat)
echo "$L: $N sandboxes idle 65 s: daemon $((T1-T0)) ticks (10 ms each)"
kill $PID; sleep 2; rm -rf $D
