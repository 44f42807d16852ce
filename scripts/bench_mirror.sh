#!/bin/bash
# Combined read rate of a two-directory mirror against each copy alone, disk-bound.
# usage: scripts/bench_mirror.sh [DISK_DIR] [SECOND_DIR] (after cargo build --release and
# cargo build --release -p colibri --example make_synthetic). Expert reads use --direct, cache 1.
#
# The second copy is a tmpfs directory by default (far faster than the disk, so the pair is
# compute-bound). With SLOW_MBPS=N (root, cgroup v1 blkio) it is instead an ext4 filesystem on
# a loop device over /dev/shm whose reads are throttled to N MB/s: a second drive of about
# the disk's speed, so the pair is disk-bound and the combined rate shows.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/colibri
M=${1:-/tmp/mirm}; S=${2:-/dev/shm/mirm}
if [ ! -f $M/config.json ]; then
  $ROOT/target/release/examples/make_synthetic --out $M --expert-gb 1 --layers 4 --skew 0 | tail -1
fi
source "$ROOT/scripts/throttled_copy.sh"
if [ -n "${SLOW_MBPS:-}" ]; then
  trap throttled_cleanup EXIT
  throttled_copy "$M" "$S" "$SLOW_MBPS" || exit 1
else
  trap 'rm -rf "$S"' EXIT
  rm -rf $S; mkdir -p $S; cp $M/* $S/
fi
P="Tell me about the rivers and bridges of the northern towns, one after another."
run() { # name, args...
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B run "$@" --cache 1 --direct --pipe 4 --threads 2 --temp 0 --max-tokens 32 --usage-save 0 --autopin 0 --prompt "$P" > $M.$name.out 2> $M.$name.err
  echo "== $name"; grep -E 'expert I/O|\[PROF\] drive|^\[run\] [0-9]' $M.$name.err | cut -c1-260
}
run disk --snap $M
run second --snap $S
run both --snap $M --mirror $S
cmp $M.disk.out $M.both.out && echo same-output
