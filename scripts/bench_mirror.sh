#!/bin/bash
# Combined read rate of a two-directory mirror (disk + tmpfs) against each alone, disk-bound.
# usage: scripts/bench_mirror.sh [DISK_DIR] [TMPFS_DIR] (after cargo build --release and
# cargo build --release -p colibri --example make_synthetic). Expert reads use --direct, cache 1.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/colibri
M=${1:-/tmp/mirm}; S=${2:-/dev/shm/mirm}
if [ ! -f $M/config.json ]; then
  $ROOT/target/release/examples/make_synthetic --out $M --expert-gb 1 --layers 4 --skew 0 | tail -1
fi
rm -rf $S; mkdir -p $S; cp $M/* $S/
P="Tell me about the rivers and bridges of the northern towns, one after another."
run() { # name, args...
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B run "$@" --cache 1 --direct --pipe 4 --threads 2 --temp 0 --max-tokens 32 --usage-save 0 --autopin 0 --prompt "$P" > $M.$name.out 2> $M.$name.err
  echo "== $name"; grep -E 'expert I/O|\[PROF\] drive|^\[run\] [0-9]' $M.$name.err | cut -c1-260
}
run disk --snap $M
run tmpfs --snap $S
run both --snap $M --mirror $S
cmp $M.disk.out $M.both.out && echo same-output
rm -rf $S
