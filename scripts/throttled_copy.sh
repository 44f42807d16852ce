# Sourced by the bench scripts: a copy of a model directory on a device of known speed.
# throttled_copy SRC DIR MBPS: copies SRC's files to an ext4 filesystem on a loop device over
# /dev/shm mounted at DIR, and moves this shell into a blkio cgroup (v1, root) that throttles
# reads of that device to MBPS MB/s. The disk under test is then a bandwidth-bound device whose
# ceiling does not move with the other tenants of the machine. throttled_cleanup undoes it.
THROTTLE_CG=/sys/fs/cgroup/blkio/colibri-bench
THROTTLE_IMG=/dev/shm/colibri-bench.img
THROTTLE_LOOP=
THROTTLE_DIR=
throttled_copy() {
  local src=$1 dir=$2 mbps=$3 size
  size=$(du -sm "$src" | cut -f1)
  truncate -s $((size * 13 / 10 + 64))M "$THROTTLE_IMG" || return 1
  THROTTLE_LOOP=$(losetup -f --show "$THROTTLE_IMG") || return 1
  # Inode tables zeroed now, not by a kernel thread during the runs.
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$THROTTLE_LOOP" && mkdir -p "$dir" && mount "$THROTTLE_LOOP" "$dir" || return 1
  THROTTLE_DIR=$dir
  cp "$src"/* "$dir"/ || return 1
  mkdir -p "$THROTTLE_CG" || return 1
  echo "$(stat -c '%Hr:%Lr' "$THROTTLE_LOOP") $((mbps * 1000000))" \
    > "$THROTTLE_CG/blkio.throttle.read_bps_device" || return 1
  echo $$ > "$THROTTLE_CG/tasks"
  echo "copy of $src on $THROTTLE_LOOP at $dir, reads throttled to $mbps MB/s"
}
throttled_cleanup() {
  [ -n "$THROTTLE_DIR" ] && umount "$THROTTLE_DIR" 2>/dev/null
  [ -n "$THROTTLE_LOOP" ] && losetup -d "$THROTTLE_LOOP"
  rm -f "$THROTTLE_IMG"
  if [ -d "$THROTTLE_CG" ]; then
    echo $$ > "$(dirname "$THROTTLE_CG")/tasks"
    rmdir "$THROTTLE_CG" 2>/dev/null
  fi
  THROTTLE_DIR= THROTTLE_LOOP=
}
