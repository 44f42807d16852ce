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
CG=/sys/fs/cgroup/blkio/colibri-mirror-bench
IMG=/dev/shm/colibri-mirror.img
LOOP=
cleanup() {
  [ -n "${SLOW_MBPS:-}" ] && { umount "$S" 2>/dev/null; [ -n "$LOOP" ] && losetup -d "$LOOP"; rm -f "$IMG";
    echo $$ > "$(dirname "$CG")/tasks"; rmdir "$CG" 2>/dev/null; }
  [ -z "${SLOW_MBPS:-}" ] && rm -rf "$S"
}
trap cleanup EXIT
if [ -n "${SLOW_MBPS:-}" ]; then
  size=$(du -sm "$M" | cut -f1)
  truncate -s $((size * 13 / 10 + 64))M "$IMG" || exit 1
  LOOP=$(losetup -f --show "$IMG") || exit 1
  mkfs.ext4 -q -F "$LOOP" && mkdir -p "$S" && mount "$LOOP" "$S" || exit 1
  mkdir -p "$CG" || exit 1
  echo "$(stat -c '%Hr:%Lr' "$LOOP") $((SLOW_MBPS * 1000000))" > "$CG/blkio.throttle.read_bps_device" || exit 1
  echo $$ > "$CG/tasks"
  echo "second copy: $LOOP on $S, reads throttled to $SLOW_MBPS MB/s"
else
  rm -rf $S; mkdir -p $S
fi
cp $M/* $S/
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
