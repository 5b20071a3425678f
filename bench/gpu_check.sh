#!/usr/bin/env bash
# The CUDA path measured on a GPU machine (issue 23), in the steps docs/benchmarks.md records.
#
#   bash bench/gpu_check.sh correctness   # export a full-size random SenseVoice, GPU-only tests, verify
#   bash bench/gpu_check.sh speed         # per-(batch, container) time and GPU memory, fp16 profile
#   bash bench/gpu_check.sh load          # python -m bench load against a CUDA server, fp16
#   bash bench/gpu_check.sh quick         # speed and load cut to fit one 10-minute command with the export
#
# Each step exports the model first if /tmp/sv_full is missing (3-4 min), and writes its logs to $OUT
# (the device tool's folder; ./gpu-out elsewhere). On the lent GPU machine, after ../shared/gpu's
# setup_device.sh: PYTHONPATH=/tmp/site:$PWD (the server also needs the `multipart` wheel there). Every
# command keeps going past a failed one, so one run returns all it could measure; each is bounded by
# `timeout`. The machine is given back 30 s after a call returns, and /tmp (the wheel, the export) with
# it: send the chunk copies and these steps as one batch of device calls.
set -uo pipefail
OUT=${OUT:-gpu-out}
MODEL=${MODEL:-/tmp/sv_full}
SIZE=${SIZE:-full}          # tiny: a dry run of this script on a CPU machine
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

step() {  # step SECONDS LOG COMMAND...: run, show and keep its output, whatever its exit status
  local limit=$1 log=$2; shift 2
  echo "== $(date -u +%T) $*" | tee -a "$OUT/$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
  echo "== exit ${PIPESTATUS[0]} at $(date -u +%T)" | tee -a "$OUT/$log"
}

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
    echo "usage: bash bench/gpu_check.sh correctness|speed|load|quick|quick2" >&2; exit 2 ;;
esac
