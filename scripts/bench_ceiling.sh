#!/bin/bash
# Cold decode against the disk's ceiling on a device of known speed: the medium model copied to
# a loop device whose reads are throttled to MBPS (default 1000) MB/s (scripts/throttled_copy.sh;
# root, cgroup v1 blkio), then `colibri bench` cold (O_DIRECT, cache 2) with --pipe 0, --pipe 4
# and --pipe 4 --pilot, alternated ROUNDS (default 2) times. Each bench line gives the replay's
# read rate against its own disk probe at the queue depth used, the reads in flight and the
# time compute waited. usage: MEDIUM=/path/to/medium scripts/bench_ceiling.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/colibri
MEDIUM=${MEDIUM:-/work/medium}
DIR=${DIR:-/mnt/colibri-ceiling}
source "$ROOT/scripts/throttled_copy.sh"
trap throttled_cleanup EXIT
throttled_copy "$MEDIUM" "$DIR" "${MBPS:-1000}" || exit 1
REF=$(mktemp)
python3 - "$REF" <<'PY'
import json, random, sys
random.seed(1)
ids = [random.randrange(100, 4000) for _ in range(97)]
json.dump({"prompt_ids": ids[:65], "full_ids": ids[:97]}, open(sys.argv[1], "w"))
PY
for r in $(seq "${ROUNDS:-2}"); do
  for mode in "--pipe 0" "--pipe 4 --pilot off" "--pipe 4 --pilot on"; do
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
    echo "== $mode"
    # shellcheck disable=SC2086
    "$B" bench --snap "$DIR" --ref "$REF" --dense-bits 8 --direct --cache 2 --autopin 0 \
      --usage-save 0 --no-membw $mode 2>&1 | grep -E "disk:|BENCH|PILOT\] o|PROF\] pilot" | cut -c1-400
  done
done
rm -f "$REF"
