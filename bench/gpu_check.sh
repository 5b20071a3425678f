#!/usr/bin/env bash
# The CUDA path measured on a GPU machine (issue 23), in the steps docs/benchmarks.md records.
#
#   bash bench/gpu_check.sh correctness   # export a full-size random SenseVoice, GPU-only tests, verify
#   bash bench/gpu_check.sh speed         # per-(batch, container) time and GPU memory, fp16 profile
#   bash bench/gpu_check.sh load          # python -m bench load against a CUDA server, fp16
#   bash bench/gpu_check.sh quick         # speed and load cut to fit one 10-minute command with the export
#   bash bench/gpu_check.sh lease         # issue 34: everything one 15-minute lease measures, in one call (below)
#   bash bench/gpu_check.sh lease-prepare # here, before a lease: the tiny Paraformer and Qwen3-ASR fp16 it verifies
#   bash bench/gpu_check.sh lease-tree    # here, first: a branch without what the lease never reads (fewer chunks)
#
# `lease` runs in one device call of at most LEASE_SECONDS (570) after the onnxruntime-gpu chunks are in
# place (docs/benchmarks.md "A lease, step by step"): setup_device.sh, the GPU-only tests, the fp16-only
# export, then in priority order verify of Paraformer and Qwen3-ASR fp16 on CUDA, bench load on the ladder at
# 256, 400, 512 streams with CUDA graphs and the cost table its server measures, the same on two servers, one
# 30 s segment with its profile, the ladder without CUDA graphs, the FSMN conv's four formulations;
# STEPS=load-servers,verify-pf (say) runs only those (and the setup and export they need), for a second call
# on a fresh machine; each step bounded by its cap and by what is left of the lease; steps.tsv records each
# one's limit, exit status and seconds; `python -m bench lease $OUT` prints the summary table at the end, and
# every log goes into $OUT/logs.tar.gz. Rehearse it on a CPU:
#   SIZE=tiny DEVICE=cpu OUT=/tmp/lease-rehearsal bash bench/gpu_check.sh lease
#
# Each step exports the model first if /tmp/sv_full is missing (3-4 min), and writes its logs to $OUT
# (the device tool's folder; ./gpu-out elsewhere). On the lent GPU machine, after ../shared/gpu's
# setup_device.sh: PYTHONPATH=/tmp/site:$PWD (the server also needs the `multipart` wheel there). Every
# command keeps going past a failed one, so one run returns all it could measure; each is bounded by
# `timeout`. The machine is given back 30 s after a call returns, and /tmp (the wheel, the export) with
# it: send the chunk copies and these steps as one batch of device calls.
set -uo pipefail
OUT=${OUT:-gpu-out}
SIZE=${SIZE:-full}          # tiny: a dry run of this script on a CPU machine
MODEL=${MODEL:-/tmp/sv_$SIZE}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

step() {  # step SECONDS LOG COMMAND...: run, show and keep its output, whatever its exit status (in STEP_RC)
  local limit=$1 log=$2; shift 2
  echo "== $(date -u +%T) $*" | tee -a "$OUT/$log"
  # timeout signals the command's whole process group: a server that bench load started goes with it
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
  STEP_RC=${PIPESTATUS[0]}
  echo "== exit $STEP_RC at $(date -u +%T)" | tee -a "$OUT/$log"
}

lease() {  # the `lease` mode: see the top of this file
  local began deadline ladder=${LADDER:-2,4,8,30} batches=${BATCHES:-1,4,16}
  local pf=${PARAFORMER_DIR:-bench-out/lease/paraformer} qw=${QWEN3_DIR:-bench-out/lease/qwen3}
  local streams seconds
  if [ "$DEVICE" = cpu ]; then streams=${STREAMS:-2,4}; seconds=${SECONDS_PER_STEP:-6}
  else streams=${STREAMS:-256,400,512}; seconds=${SECONDS_PER_STEP:-15}; fi
  began=$(date +%s); deadline=$((began + ${LEASE_SECONDS:-570}))
  : > "$OUT/steps.tsv"
  run_step() {  # run_step NAME CAP LOG COMMAND...: at most CAP seconds, and never past the deadline
    local name=$1 cap=$2 log=$3; shift 3
    local left=$((deadline - $(date +%s))) t0
    case $name in setup | export) ;; *) case ",${STEPS:-$name}," in *",$name,"*) ;; *) return ;; esac ;; esac
    local limit=$((cap < left - 5 ? cap : left - 5))
    if [ "$limit" -lt 15 ]; then printf '%s\t%s\tskipped\t0\n' "$name" "$cap" >> "$OUT/steps.tsv"; return; fi
    t0=$(date +%s)
    step "$limit" "$log" "$@"
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$STEP_RC" "$(($(date +%s) - t0))" >> "$OUT/steps.tsv"
  }
  local part i
  for part in .gpu-wheels/ort*/part; do  # the last chunk rides with this call (lease-chunks)
    [ -f "$part" ] || continue
    i=$(basename "$(dirname "$part")"); mkdir -p /tmp/parts && cp "$part" "/tmp/parts/${i#ort}"
  done
  if [ "$DEVICE" = cuda ] && [ -f .gpu-wheels/small/setup_device.sh ]; then
    run_step setup 90 setup.txt bash .gpu-wheels/small/setup_device.sh
    export PYTHONPATH=/tmp/site:$PWD
  fi
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
  # 0. the GPU-only tests (skipped where CI runs): exactness, in-graph decoding, and CUDA graphs, SenseVoice's
  #    default on CUDA since stop 47 but never run by default on a GPU; the tiny export they need is made
  #    here when the lease tree left out the committed ones (34 s on the 2-core Zen 3)
  run_step cuda-tests 120 cuda-tests.txt "$PY" -m pytest -q -p no:cacheprovider -p no:asyncio -rs \
    tests/pipeline/test_cuda.py
  if [ ! -f "$MODEL/manifest.json" ]; then  # fp16 only: one graph traced, no fp32 (export/onnx_export.py)
    rm -rf "$MODEL"
    run_step export 150 export.txt "$PY" -m export sensevoice --random-init "$SIZE" --precision fp16 --out "$MODEL"
  fi
  # 1. the other families' CUDA path, on tiny fp16 exports made before the lease (lease-prepare): first, being
  #    cheap, and Paraformer's with verify's fp16 rule for a moved CIF fire, never run on a GPU
  [ -f "$pf/manifest.json" ] || run_step export-pf 60 export-pf.txt "$PY" -m export paraformer --random-init tiny \
    --precision fp16 --out "$pf"
  run_step verify-pf 45 verify-paraformer.txt "$PY" -m export verify "$pf" --device "$DEVICE"
  [ -f "$qw/manifest.json" ] || run_step export-qw 60 export-qw.txt "$PY" -m export qwen3-asr --random-init tiny \
    --container 8 --precision fp16 --out "$qw"
  run_step verify-qw 45 verify-qwen3.txt "$PY" -m export verify "$qw" --device "$DEVICE" --lengths 2,5,7.5
  # 2. the ladder with CUDA graphs (SenseVoice's default since stop 47) and a batch of 64, planned from the
  #    table the server measures after its warm-up and writes to costs-graph.json (time per call, build
  #    seconds and GPU memory per shape: one warm-up pays for both): the second lease found a call's 19-32 ms
  #    set by the graph's node launches, which one replayed graph per shape saves (docs/benchmarks.md)
  run_step load-graph 200 load-graph.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" --precision fp16 \
    --containers "$ladder" --batch-sizes "${GRAPH_BATCHES:-1,4,16,64}" --cuda-graph --measure-costs \
    --cost-table "$OUT/costs-graph.json" \
    --server-log-level info --streams "$streams" --seconds "$seconds" --target 0.5 --max-time 120 \
    --keep-going --final-timeout 30 --server-log "$OUT/server-graph.txt" --save "$OUT/load-graph.json"
  # 3. two servers on the one GPU, the streams dealt out in turn (deploy/haproxy.cfg on one box): the third
  #    lease's one server met 400 streams with CUDA graphs but not 512 (p95 2.9 s after the VAD, the worker
  #    behind, 139 % CPU: its event loop and its worker share one GIL). Batch sizes up to 16: each server's
  #    grid holds its own GPU memory (batch 64 x 30 s alone took 22 GiB)
  run_step load-servers 200 load-servers.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" \
    --precision fp16 --servers 2 --containers "$ladder" --batch-sizes "$batches" --cuda-graph --measure-costs \
    --cost-table "$OUT/costs-servers.json" --server-log-level info --streams "${SERVER_STREAMS:-$streams}" \
    --seconds "$seconds" --target 0.5 --max-time 120 --keep-going --final-timeout 30 \
    --server-log "$OUT/server-servers.txt" --save "$OUT/load-servers.json"
  # 4. one 30 s segment alone (the serving path, batch 1) and its ORT profile
  run_step segment30 60 segment30.txt "$PY" -m bench -v model "$MODEL" --device "$DEVICE" --precision fp16 \
    --skip exact,fixed --containers 30 --batch-sizes 1 --lengths 30 --repeats 20 --warmup 3 \
    --profile "$OUT/profile" --save "$OUT/segment30.json"
  # 5. the ladder without CUDA graphs (--no-cuda-graph), its table in costs.json
  run_step load 330 load.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" --precision fp16 \
    --no-cuda-graph --containers "$ladder" --batch-sizes "$batches" --measure-costs --cost-table "$OUT/costs.json" \
    --server-log-level info --streams "$streams" --seconds "$seconds" --target 0.5 --max-time 150 \
    --keep-going --final-timeout 30 --server-log "$OUT/server.txt" --save "$OUT/load.json"
  # 6. why a CUDA session's first run is slow: the FSMN block's depthwise conv written four ways
  run_step fsmn 90 fsmn.txt "$PY" -m bench fsmn --device "$DEVICE" --save "$OUT/fsmn.json"
  echo "lease: $(($(date +%s) - began)) s of ${LEASE_SECONDS:-570}" | tee -a "$OUT/steps.txt"
  "$PY" -m bench lease "$OUT" | tee "$OUT/summary.txt"
  # The device tool brings back 8 files of $OUT (the second lease lost server.txt, the ninth): every log in
  # one archive, the summary and the two tables beside it
  tar -czf /tmp/lease-logs.tar.gz -C "$OUT" . && find "$OUT" -mindepth 1 -not -name summary.txt \
    -not -name 'costs.json' -not -name 'costs-graph.json' -not -name 'load*.json' -delete && mv /tmp/lease-logs.tar.gz "$OUT/logs.tar.gz"
}

case "${1:-}" in
  lease) lease; exit 0 ;;
  lease-tree)  # here, first: a temporary branch without the committed exports and the demo model (42 MB that
    # travel with every device call and left 9 MiB a chunk: 28 calls), which the lease does not read
    [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash your changes first"; exit 1; }
    git switch -q -c lease-tree && git rm -rq tests/fixtures/exports models/demo &&
      git commit -qm "Temporary lease tree (bench/gpu_check.sh lease-tree): never merged" || exit 1
    echo "on branch lease-tree; afterwards: git switch - && git branch -D lease-tree"
    exit 0 ;;
  lease-chunks)  # here, after lease-tree and ../shared/gpu/prepare.sh: the wheel in the fewest calls 64 MiB allows
    n=$(cat .gpu-wheels/small/ort.parts); whl=/tmp/ort-gpu.whl; : > "$whl"
    for i in $(seq 0 $((n - 1))); do cat ".gpu-wheels/ort$i/part" >> "$whl"; done
    [ "$(sha256sum "$whl" | cut -d' ' -f1)" = "$(cat .gpu-wheels/small/ort.sha256)" ] || { echo "chunks damaged"; exit 1; }
    # What travels with every call (tracked and untracked-unignored files), plus 1.5 MiB of slack (prepare.sh
    # keeps 5, which costs a seventh call); the last chunk is small enough to ride with the lease call.
    tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    room=$(( (64 << 20) - tree - (3 << 19) ))
    rm -rf .gpu-wheels/ort*; split -b "$room" -d -a 2 "$whl" /tmp/ort-gpu.part.
    n=0; for f in /tmp/ort-gpu.part.*; do mkdir -p ".gpu-wheels/ort$n"; mv "$f" ".gpu-wheels/ort$n/part"; n=$((n + 1)); done
    echo $n > .gpu-wheels/small/ort.parts; rm -f "$whl"
    echo "checkout $((tree >> 20)) MiB: $((n - 1)) chunk calls of $((room >> 20)) MiB (.gpu-wheels/ort0..ort$((n - 2))), then the lease call carrying .gpu-wheels/small .gpu-wheels/ort$((n - 1)) bench-out/lease"
    du -sh .gpu-wheels/* bench-out/lease 2>/dev/null
    exit 0 ;;
  lease-prepare)  # here: what the lease carries (bench-out/ is ignored by git, so it travels only when named)
    for d in paraformer qwen3; do rm -rf "bench-out/lease/$d"; done
    "$PY" -m export paraformer --random-init tiny --precision fp16 --out bench-out/lease/paraformer &&
      "$PY" -m export qwen3-asr --random-init tiny --container 8 --precision fp16 --out bench-out/lease/qwen3 &&
      du -sh bench-out/lease/*
    exit $? ;;
esac

if [ ! -f "$MODEL/manifest.json" ]; then
  rm -rf "$MODEL"
  step 260 export.txt "$PY" -m export sensevoice --random-init "$SIZE" --precision fp32,fp16 --out "$MODEL"
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

case "${1:-}" in
  correctness)
    step 240 pytest.txt "$PY" -m pytest -q -p no:cacheprovider -p no:asyncio -rs tests/pipeline/test_cuda.py \
      tests/pipeline/test_batching.py tests/pipeline/test_engine.py
    step 240 verify.txt "$PY" -m export verify "$MODEL" --device "$DEVICE"
    ;;
  speed)
    step 200 model.txt "$PY" -m bench model "$MODEL" --device "$DEVICE" --precision fp16,fp32 --skip exact \
      --containers 2,4,8,15,30 --batch-sizes 1,4,16,32 --repeats 20 --warmup 3 --save "$OUT/model.json"
    step 120 model4.txt "$PY" -m bench model "$MODEL" --device "$DEVICE" --precision fp16,fp32 \
      --skip exact,fixed --containers 4 --batch-sizes 1,4,16,32 --repeats 20 --warmup 3
    step 120 profile.txt "$PY" -m bench model "$MODEL" --device "$DEVICE" --precision fp16 --skip exact,fixed,batches \
      --containers 30 --repeats 5 --profile /tmp/gpu-profile
    ;;
  load)
    step 560 load.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" --precision fp16 \
      --streams "${STREAMS:-64,128,256,400,512}" --seconds "${SECONDS_PER_STEP:-20}" --target 0.5 \
      --max-time 480 --server-log "$OUT/server.txt" --save "$OUT/load.json"
    ;;
  quick)
    step 130 model.txt "$PY" -m bench model "$MODEL" --device "$DEVICE" --precision fp16 --skip exact,fixed \
      --containers 4,30 --batch-sizes 1,4,16,32 --repeats 10 --warmup 2 --profile /tmp/gpu-profile \
      --save "$OUT/model.json"
    step 175 load.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" --precision fp16 \
      --streams "${STREAMS:-128,256,400}" --seconds "${SECONDS_PER_STEP:-15}" --target 0.5 \
      --max-time 150 --server-log "$OUT/server.txt" --save "$OUT/load.json"
    ;;
  quick2)  # the same for fp32, and the load on the CPU's ladder of containers instead of 30 s alone
    step 130 model.txt "$PY" -m bench model "$MODEL" --device "$DEVICE" --precision fp32 --skip exact,fixed \
      --containers 4,30 --batch-sizes 1,4,16,32 --repeats 10 --warmup 2 --save "$OUT/model.json"
    step 175 load.txt "$PY" -m bench load --model "$MODEL" --device "$DEVICE" --precision fp16 \
      --containers 2,4,8,15,30 --streams "${STREAMS:-256,400}" --seconds "${SECONDS_PER_STEP:-15}" --target 0.5 \
      --max-time 150 --server-log "$OUT/server.txt" --save "$OUT/load.json"
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh correctness|speed|load|quick|quick2|lease|lease-tree|lease-chunks|lease-prepare" >&2
    exit 2 ;;
esac
