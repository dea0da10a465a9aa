#!/usr/bin/env bash
# The GPU run of `llmdiag nccl-bench` (issue 7): on a machine with NVIDIA GPUs, self-checking, under a time limit.
#
#   bash bench/gpu_nccl_check.sh                 # results under ./gpu-nccl-check/ ; exit 0 all checks pass, 1 not
#   LIMIT=300 OUT=/tmp/x bash bench/gpu_nccl_check.sh
#   VENV=/path/to/prepared/venv SKIP_INSTALL=1 bash bench/gpu_nccl_check.sh   # air-gapped: a venv made beforehand
#
# What it does:
#   1. nvidia-smi: the GPUs, driver, and the topology (NVLink / PCIe between them).
#   2. a virtualenv (--system-site-packages, so a CUDA torch already on the machine is used as is) with llmdiag[gpu];
#      torch==2.13.0 is installed into it only when no CUDA torch is importable (TORCH_SPEC overrides; on a machine
#      without network access, have a CUDA torch installed system-wide or in $VENV beforehand).
#   3. one rank (`torchrun --nproc-per-node 1 -m llmdiag.nccl_bench`, the module users run by hand): a world of 1 has
#      no inter-GPU link, so it runs the device-memory copy probe and compares it with NVML's peak (max memory clock x
#      bus width x 2).
#   4. with 2+ GPUs, also every GPU (up to 8) through `llmdiag nccl-bench` (which launches the ranks of
#      llmdiag.collect.nccl.bench and judges rank 0's measurement), 1M:1G, against the link NVML reports.
#   5. checks the JSON: backend nccl, correct results, copy bandwidth 30-105 % of the NVML peak, busbw > 0 and its
#      ratio to the link's expected busbw in (0.05, 1.5); prints PASS/FAIL per check.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT="${LIMIT:-420}"                       # seconds for the whole script
OUT="${OUT:-$PWD/gpu-nccl-check}"
VENV="${VENV:-${LLMDIAG_CACHE_DIR:-$HOME/.cache/llmdiag}/gpu-nccl-venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"
START=$(date +%s)
mkdir -p "$OUT"
FAILED=0

say() { printf '\n== %s\n' "$*"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
check() {  # check NAME PYTHON-EXPR-ON-REPORT(s)
  if "$VENV/bin/python" - "$@" <<'EOF'
import json, sys
name, expr, *files = sys.argv[1:]
r = [json.load(open(f)) for f in files]
ok = bool(eval(expr, {"r": r, "r0": r[0]}))
print(("PASS" if ok else "FAIL") + ": " + name)
sys.exit(0 if ok else 1)
EOF
  then :; else FAILED=1; fi
}

say "nvidia-smi"
if ! command -v nvidia-smi >/dev/null; then
  echo "ERROR: nvidia-smi not found: this script needs an NVIDIA GPU machine"; exit 2
fi
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max \
  --format=csv || { echo "ERROR: nvidia-smi failed"; exit 2; }
nvidia-smi topo -m || true
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)

say "virtualenv $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV" || { echo "ERROR: cannot create $VENV"; exit 2; }
fi
T0=$(date +%s)
if [ "${SKIP_INSTALL:-0}" = 1 ]; then
  echo "SKIP_INSTALL=1: using $VENV as it is"
else
  timeout "$(left)" "$VENV/bin/python" -m pip install -q -e "$REPO[gpu]" \
    || { echo "ERROR: pip install -e '$REPO[gpu]' failed (offline? see the header)"; exit 2; }
fi
if [ "${SKIP_INSTALL:-0}" != 1 ] && ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "no CUDA torch importable: installing $TORCH_SPEC (several GB from PyPI)"
  timeout "$(left)" "$VENV/bin/python" -m pip install -q "$TORCH_SPEC" numpy \
    || { echo "ERROR: could not install $TORCH_SPEC"; exit 2; }
fi
"$VENV/bin/python" -c '
import torch
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:  # a CPU build has no NCCL
    nccl = f"none ({type(exc).__name__})"
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(), "NCCL", nccl)' \
  || { echo "ERROR: torch does not import"; exit 2; }
echo "install: $(( $(date +%s) - T0 )) s"

say "one rank: the NCCL world of 1 and the device-memory copy probe"
PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
T0=$(date +%s)
OMP_NUM_THREADS=1 timeout "$(left)" "$VENV/bin/python" -m torch.distributed.run --nproc-per-node 1 \
  --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" -m llmdiag.nccl_bench --json "$OUT/world1.json" \
  2> "$OUT/world1.stderr" | tee "$OUT/world1.txt"
echo "rc=${PIPESTATUS[0]} in $(( $(date +%s) - T0 )) s"
if [ -s "$OUT/world1.json" ]; then
  check "world 1: the report model (schema 1), backend nccl, one rank, no collectives" \
    'r0["schema_version"] == "1" and r0["backend"] == "nccl" and r0["world_size"] == 1 and r0["results"] == []' \
    "$OUT/world1.json"
  check "world 1: no inter-GPU link, said so" 'r0["link"]["name"] is None and "no inter-GPU link" in r0["link"]["unavailable"]' \
    "$OUT/world1.json"
  check "memory probe: copy correct" 'r0["memory_probe"]["check"] == "ok"' "$OUT/world1.json"
  check "memory probe: > 100 GB/s read+write" 'r0["memory_probe"]["copy_bandwidth_bytes_per_second"] > 100e9' \
    "$OUT/world1.json"
  check "memory probe: 30-105 % of the NVML peak" \
    'r0["memory_probe"]["copy_vs_peak_ratio"] is not None and 0.30 <= r0["memory_probe"]["copy_vs_peak_ratio"] <= 1.05' \
    "$OUT/world1.json"
  check "signal device_memory_copy_bandwidth_bytes_per_second is set" \
    'r0["signals"]["device_memory_copy_bandwidth_bytes_per_second"]["stats"]["value"] > 0' "$OUT/world1.json"
else
  echo "FAIL: no world1.json; stderr:"; tail -20 "$OUT/world1.stderr"; FAILED=1
fi

if [ "$NGPU" -ge 2 ] && [ "$(left)" -gt 60 ]; then
  N=$(( NGPU < 8 ? NGPU : 8 ))
  say "$N ranks through llmdiag nccl-bench (1M:1G)"
  T0=$(date +%s)
  timeout "$(left)" "$VENV/bin/llmdiag" nccl-bench --nproc-per-node "$N" --sizes 1M:1G --iters 20 --warmup 5 \
    --json "$OUT/worldN.json" --fail-on never | tee "$OUT/worldN.txt"
  echo "rc=${PIPESTATUS[0]} in $(( $(date +%s) - T0 )) s"
  if [ -s "$OUT/worldN.json" ]; then
    check "world $N: every op measured, none failed" \
      'r0["failed_ops"] == {} and {m["op"] for m in r0["results"]} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}' \
      "$OUT/worldN.json"
    check "world $N: busbw = algbw x nccl-tests factor" \
      'all(m["busbw_bytes_per_second"] == m["algbw_bytes_per_second"] * m["bus_factor"] for m in r0["results"])' \
      "$OUT/worldN.json"
    check "world $N: link named from NVML" 'r0["link"]["name"] is not None' "$OUT/worldN.json"
    check "world $N: busbw vs link ratio plausible (0.05-1.5)" \
      '0.05 < r0["signals"]["collective_bus_bandwidth_vs_link_ratio"]["stats"].get("value", 0) < 1.5' "$OUT/worldN.json"
  else
    echo "FAIL: no worldN.json"; FAILED=1
  fi
else
  say "one GPU: no multi-rank run (needs 2+ GPUs)"
fi

say "result: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - START )) s; files under $OUT"
exit $FAILED
