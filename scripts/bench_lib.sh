# Shared by bench_llamacpp.sh and bench_gguf.sh (sourced, not run): reading llama-bench's
# and colibri bench's figures, alternated pairs, page-cache eviction, memory cgroups and llama.cpp's
# CPU builds (the one without AMX too).
# The sourcing script sets PAIRS and the arrays COLI (colibri bench ...) and LLAMA
# (llama-bench ...), and defines log().
# The tokens per second (avg_ts) of the last test in llama-bench's CSV on stdin, "" if none.
csv_ts() {
  python3 -c '
import csv, sys
rows = list(csv.DictReader(l for l in sys.stdin if l.strip()))
ts = rows[-1].get("avg_ts", "") if rows else ""
print("%.2f" % float(ts) if ts else "")'
}

# llama-bench's own default first (weights repacked, AMX where the CPU has it: its fastest
# path). On an AVX-512 + AMX Xeon that default segfaults or aborts in its AMX matrix product
# (ggml_backend_amx_mul_mat) on prompt batches, and on some families' decode. Where it gives no
# figure, llama.cpp gets its two working paths and the faster counts: the build without AMX
# (LLAMA_NOAMX, build_llama_noamx below; its weights still repacked for AVX-512, which is what
# a user of that CPU would build to get past the crash) and --repack 0 (the weights as stored).
# Prints the figure and which path gave it: default, no-amx or repack0.
llama_ts() {
  local ts noamx="" plain
  ts=$({ "$@" -o csv 2>/dev/null || true; } | csv_ts)
  if [ -n "$ts" ]; then echo "$ts default"; return; fi
  if [ -n "${LLAMA_NOAMX:-}" ]; then
    noamx=$({ "$LLAMA_NOAMX" "${@:2}" -o csv 2>/dev/null || true; } | csv_ts)
  fi
  plain=$({ "$@" --repack 0 -o csv 2>/dev/null || true; } | csv_ts)
  log "llama-bench's default gave no figure (crashed?): without AMX ${noamx:-none}, --repack 0 ${plain:-none}; the faster counts"
  python3 -c '
import sys
figs = [(float(v), name) for v, name in zip(sys.argv[1::2], sys.argv[2::2]) if v]
if figs:
    v, name = max(figs)
    print("%.2f %s" % (v, name))' "$noamx" no-amx "$plain" repack0
}

# cmake (and ninja) on PATH: the machine's, or from PyPI in a venv of their own in $DIR/tools.
need_cmake() {
  command -v cmake >/dev/null && return 0
  [ -x "$DIR/tools/bin/cmake" ] || { python3 -m venv "$DIR/tools" && "$DIR/tools/bin/pip" install -q cmake ninja; }
  export PATH=$DIR/tools/bin:$PATH
}

# llama.cpp for the CPU only: the source $1 configured into the build directory $2 with the
# cmake flags after `--`, then the targets before it built; logs in $DIR/cmake-$3configure.log
# and $DIR/cmake-$3build.log.
llama_cmake() {
  local src=$1 out=$2 tag=$3 targets=() gen=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do targets+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  need_cmake
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src" -B "$out" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" -DGGML_CUDA=OFF \
    -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >"$DIR/cmake-${tag}configure.log"
  cmake --build "$out" --target "${targets[@]}" -j "$(nproc)" >"$DIR/cmake-${tag}build.log"
}

# On a CPU with AMX: llama-bench built for the same CPU without AMX (GGML_NATIVE off, every
# other vector extension the CPU has on), once, in $DIR/build-noamx, from the llama.cpp source
# $1. Sets LLAMA_NOAMX to it; empty where the CPU has no AMX (the default build then works).
build_llama_noamx() {
  local src=$1 out=$DIR/build-noamx flags=() pair
  LLAMA_NOAMX=""
  grep -qw amx_int8 /proc/cpuinfo || return 0
  if [ ! -x "$out/bin/llama-bench" ]; then
    for pair in avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx512f:AVX512 avx512_vbmi:AVX512_VBMI \
      avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
      if grep -qw "${pair%%:*}" /proc/cpuinfo; then flags+=("-DGGML_${pair#*:}=ON"); else flags+=("-DGGML_${pair#*:}=OFF"); fi
    done
    log "building llama-bench without AMX into $out (once): its AMX path crashes on this CPU"
    llama_cmake "$src" "$out" noamx- llama-bench -- -DGGML_NATIVE=OFF "${flags[@]}" \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  fi
  LLAMA_NOAMX=$out/bin/llama-bench
}

# A field of colibri bench's BENCH line.
field() { sed -n "s/^BENCH .*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

ratio() { python3 -c "import sys; a, b = sys.argv[1:]; print(f'{float(a)/float(b):.2f}' if a and b and float(b) > 0 else '-')" "$1" "$2"; }

median() { python3 -c "import statistics, sys; v = [float(x) for x in sys.argv[1:] if x != '-']; print(f'{statistics.median(v):.2f}' if v else '-')" "$@"; }

load() { uptime | sed 's/.*load average/load average/'; }

# Alternated pairs of one figure: its name, colibri's bench arguments and its BENCH field,
# llama-bench's arguments, the unit.
run_pairs() {
  local name=$1 coli_args=$2 coli_field=$3 llama_args=$4 unit=$5
  local ratios=() c l lpath out
  echo "## $name ($PAIRS pairs, order alternating) | $(load)"
  for i in $(seq 1 "$PAIRS"); do
    c=""; l=""; lpath=""
    for side in $(if [ $((i % 2)) = 1 ]; then echo llama coli; else echo coli llama; fi); do
      if [ "$side" = llama ]; then
        # shellcheck disable=SC2086
        read -r l lpath <<<"$(llama_ts "${LLAMA[@]}" $llama_args)"
      else
        # shellcheck disable=SC2086
        out=$("${COLI[@]}" --warmup $coli_args 2>/dev/null) || true
        c=$(field "$coli_field" "$out")
      fi
    done
    ratios+=("$(ratio "$c" "$l")")
    echo "pair $i: colibri ${c:--} $unit | llama.cpp ${l:--} $unit$(case $lpath in no-amx) echo " (built without AMX)";; repack0) echo " (--repack 0)";; esac) | ratio ${ratios[-1]}"
  done
  echo "median ratio $name: $(median "${ratios[@]}") | $(load)"
}

# Drops the files' pages from the page cache (clean pages, no privilege needed): a cgroup
# started after a warm run would otherwise map pages charged to another group, uncounted.
evict() {
  python3 - "$@" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

# "$@" limited to $1 bytes of memory (bench_llamacpp.sh's cgroup method); 125 if impossible.
limited() {
  local bytes=$1; shift
  if systemd-run --scope -q -p MemoryMax=64M true 2>/dev/null; then
    systemd-run --scope -q -p MemoryMax="$bytes" -p MemorySwapMax=0 "$@"
    return
  fi
  local v1 v2 cg=""
  v1=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}:\(.*\)/\3/p' /proc/self/cgroup)
  v2=$(sed -n 's/^0::\(.*\)/\1/p' /proc/self/cgroup)
  if [ -n "$v1" ] && [ -w "/sys/fs/cgroup/memory$v1" ]; then
    cg=/sys/fs/cgroup/memory${v1%/}/colibri-bench-$$
    mkdir -p "$cg" && echo "$bytes" >"$cg/memory.limit_in_bytes" || cg=""
    [ -z "$cg" ] || [ ! -f "$cg/memory.memsw.limit_in_bytes" ] || echo "$bytes" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
  elif [ -n "$v2" ] && [ -f "/sys/fs/cgroup${v2%/}/memory.max" ]; then
    cg=/sys/fs/cgroup${v2%/}/colibri-bench-$$
    # A kernel without swap accounting has no memory.swap.max: the limit still holds.
    mkdir -p "$cg" && echo "$bytes" >"$cg/memory.max" && { echo 0 >"$cg/memory.swap.max" 2>/dev/null || true; } || cg=""
  fi
  [ -n "$cg" ] || { log "no memory cgroup could be made here"; return 125; }
  local rc=0
  (echo "$BASHPID" >"$cg/cgroup.procs" && exec "$@") || rc=$?
  rmdir "$cg" 2>/dev/null || true
  return $rc
}

# The three warm figures of one model, alternated pairs each: decode tg$GEN, prefill 64, 512.
warm_pairs() {
  run_pairs "warm decode tg$GEN" "--prompt-tokens 1 --gen-tokens $GEN" decode_tok_s "-p 0 -n $GEN" tok/s
  run_pairs "prefill pp64" "--prompt-tokens 64 --gen-tokens 1" prefill_pos_s "-p 64 -n 0" pos/s
  run_pairs "prefill pp512" "--prompt-tokens 512 --gen-tokens 1" prefill_pos_s "-p 512 -n 0" pos/s
}

# MEM_PAIRS cold decodes under a memory cgroup: colibri bench on $3 limited to $1 bytes, then
# llama-bench (LLAMA) limited to $2 bytes, the files "${@:4}" dropped from the page cache
# before each. colibri's budget comes from the cgroup's limit (88% of it: no --ram-gb);
# COLI_MEM_ARGS adds options of its own. llama.cpp gets MEM_TIMEOUT s for MEM_GEN_LLAMA tokens,
# with LLAMA_MEM_ARGS (default --repack 0: its default repacks the weights into anonymous
# memory, which the cgroup's OOM killer stops at once; with --repack 0 it pages them in
# through mmap, its way of running a model bigger than memory).
mem_pairs() {
  local cb=$1 lb=$2 snap=$3 c l rc t0 why out
  shift 3
  for i in $(seq 1 "$MEM_PAIRS"); do
    evict "$@"
    # shellcheck disable=SC2086
    out=$(limited "$cb" "$BIN" bench --snap "$snap" --threads "$THREADS" --no-membw --direct \
      --prompt-tokens 1 --gen-tokens "$MEM_GEN" ${COLI_MEM_ARGS:-} 2>&1) || true
    c=$(field decode_tok_s "$out")
    echo "colibri: ${c:--} tok/s, hit $(field hit_pct "$out")%, read $(field read_gbs "$out") GB/s"
    grep -E '^\[RAM\] budget|expert loads/token|^\[bench\] disk:' <<<"$out" | sed 's/^/  /' || true
    [ -n "$c" ] || tail -3 <<<"$out" | sed 's/^/  /'
    evict "$@"
    t0=$(date +%s)
    rc=0
    # shellcheck disable=SC2086
    limited "$lb" timeout "$MEM_TIMEOUT" "${LLAMA[@]}" ${LLAMA_MEM_ARGS:---repack 0} --no-warmup -p 0 -n "$MEM_GEN_LLAMA" -o csv \
      >"$DIR/llama-mem.csv" 2>"$DIR/llama-mem.err" || rc=$?
    l=$(csv_ts <"$DIR/llama-mem.csv")
    if [ -n "$l" ]; then
      echo "llama.cpp: $l tok/s (tg$MEM_GEN_LLAMA, $(($(date +%s) - t0)) s in all) | ratio $(ratio "$c" "$l")"
    else
      case $rc in
        124) why="timed out" ;;
        137) why="killed (the cgroup's OOM killer)" ;;
        *) why="exit $rc: $(grep -v '^\s*$' "$DIR/llama-mem.err" | tail -1)" ;;
      esac
      echo "llama.cpp: no result after $(($(date +%s) - t0)) s: $why (tg$MEM_GEN_LLAMA, limit ${MEM_TIMEOUT} s)"
    fi
  done
  echo "| $(load)"
}
