#!/bin/bash
# usage: outputdrain.sh BIN_DIR LABEL BYTES  (BIN_DIR holds mayfly and mayflyd; run as root)
# A command writes BYTES to stdout, far past the default 16 MiB output limit; prints the wall
# time and the daemon's CPU time (10 ms ticks) for the whole exec, twice (docs/BENCHMARKS.md).
set -e
B=$1; L=$2; N=$3; D=/tmp/mfo-$L; rm -rf $D; mkdir -p $D
$B/mayfly --socket $D/s.sock serve --state-dir $D/state --pool host=0 --gateway off > $D/log 2>&1 &
for i in $(seq 100); do [ -S $D/s.sock ] && break; sleep 0.1; done; sleep 0.5
PID=$(pgrep -f "mayflyd --socket $D/s.sock serve")
M="$B/mayfly --socket $D/s.sock"; ID=$($M create --ttl 10m)
for i in 1 2; do
  T0=$(awk '{print $14+$15}' /proc/$PID/stat); S=$(date +%s.%N)
  $M exec $ID -- sh -c "head -c $N /dev/zero" 2>/dev/null | wc -c > /dev/null
  E=$(date +%s.%N); T1=$(awk '{print $14+$15}' /proc/$PID/stat)
  echo "$L: $N bytes past the limit: wall $(echo "$E - $S" | bc) s, daemon $((T1-T0)) ticks"
done
kill $PID; sleep 2; rm -rf $D
