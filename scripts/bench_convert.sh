#!/usr/bin/env bash
# Convert throughput against the disk's own read and write rates, measured in the same run.
#
#   cargo run --release -p colibri --example make_synthetic -- --out /work/synth-bf16 --expert-gb 6 --bf16 --shard-gb 2
#   scripts/bench_convert.sh /work/synth-bf16 /work/synth-int4 [convert options...]
#
# The source's pages are dropped from the page cache first (posix_fadvise DONTNEED on its
# files only), so the conversion reads from the disk; dd with iflag/oflag=direct gives the
# disk's sequential read and write rates before and after. Peak RSS comes from /usr/bin/time.
set -euo pipefail
SRC=$1; OUT=$2; shift 2
BIN=${BIN:-target/release/colibri}
log() { echo "[bench_convert] $*" >&2; }
# evict: the files' pages dropped from the page cache.
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
probe() {
  local big; big=$(ls -S "$SRC"/*.safetensors | head -1)
  echo "disk read  (dd iflag=direct, $(basename "$big")): $(dd if="$big" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1)"
  echo "disk write (dd oflag=direct, 1 GiB):  $(dd if=/dev/zero of="$OUT.ddprobe" bs=8M count=128 oflag=direct 2>&1 | tail -1)"
  rm -f "$OUT.ddprobe"
}
rm -rf "$OUT"
probe
evict "$SRC"/*.safetensors
/usr/bin/time -v "$BIN" convert --from "$SRC" --to "$OUT" "$@" 2> "$OUT.log" || { cat "$OUT.log"; exit 1; }
grep -E '^\[(PLAN|DONE)\]|Maximum resident|Elapsed \(wall|Percent of CPU' "$OUT.log"
probe
