#!/usr/bin/env bash
# The prepared GPU check (issue 37): MLA agreement in float32 and bfloat16, then the extraction benchmark
# on a random model of Kimi-K2.5's width, then a results table. Runs offline, installs nothing: the
# packages the engine needs beyond torch/transformers/safetensors/accelerate/tokenizers/pyarrow
# (pydantic and its dependencies) are unpacked from bench/wheels/ into the work directory.
#
# usage: bench/gpu_check.sh OUT_DIR [--device cuda|cpu] [--small] [--work DIR]
#   OUT_DIR   gets results.md, results.json, mla.json, extract.json, meta.json, steps.tsv and logs/
#   --device  cuda (default) or cpu; --small: CPU sizes (H 256, short samples: ~20 s on 2 cores)
#   --work    models, input and states (default: a fresh directory under ${TMPDIR:-/tmp}, removed at exit;
#             the full run needs ~25 GB there)
# environment: PYTHON (default python3); GPU_CHECK_MLA_TIMEOUT / GPU_CHECK_EXTRACT_TIMEOUT (seconds,
#   default 150 / 270: with setup and report the whole run stays under 8 minutes).
# Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or setup error.
set -u -o pipefail
usage() { sed -n '6,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

OUT="" DEVICE=cuda SMALL="" WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:-}"; shift 2 || usage ;;
    --small) SMALL=--small; shift ;;
    --work) WORK="${2:-}"; shift 2 || usage ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) [ -z "$OUT" ] || usage; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || usage
case "$DEVICE" in cuda|cpu) ;; *) echo "--device must be cuda or cpu" >&2; exit 2 ;; esac

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
mkdir -p "$OUT/logs" || exit 2
OUT="$(cd "$OUT" && pwd)"
rm -f "$OUT/steps.tsv" "$OUT/mla.json" "$OUT/extract.json" "$OUT/results.md" "$OUT/results.json"
if [ -z "$WORK" ]; then
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")" || exit 2
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK" || exit 2
T0=$(date +%s)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1

# --- setup: python >= 3.11 with torch; the bundled wheels (pure, or this python's pydantic_core) on PYTHONPATH
PYLIB="$WORK/pylib"
"$PY" - "$ROOT/bench/wheels" "$PYLIB" <<'EOF' || { echo "setup failed: see above" >&2; exit 2; }
import sys, zipfile
from pathlib import Path
if sys.version_info < (3, 11):
    sys.exit(f"python >= 3.11 needed (the engine's requires-python), this is {sys.version.split()[0]}")
wheels, lib = Path(sys.argv[1]), Path(sys.argv[2])
tag = f"-cp{sys.version_info[0]}{sys.version_info[1]}-"
lib.mkdir(parents=True, exist_ok=True)
for w in sorted(wheels.glob("*.whl")):
    if "-py3-none-any" in w.name or tag in w.name:
        zipfile.ZipFile(w).extractall(lib)
EOF
export PYTHONPATH="$PYLIB${PYTHONPATH:+:$PYTHONPATH}"
(cd "$ROOT" && "$PY" - "$OUT/meta.json" "$DEVICE" "${SMALL:-full}" <<'EOF') || { echo "setup failed: see above" >&2; exit 2; }
import json, platform, subprocess, sys, time
import pydantic, torch, transformers
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
if sys.argv[2] == "cuda" and gpu == "none":
    sys.exit("no CUDA device visible to torch (use --device cpu)")
meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host": platform.node(),
        "device": sys.argv[2], "sizes": sys.argv[3].lstrip("-"), "gpu": gpu, "python": sys.version.split()[0],
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "pydantic": pydantic.__version__, "commit": commit or "n/a (no git)"}
open(sys.argv[1], "w").write(json.dumps(meta, indent=1))
print("gpu_check:", ", ".join(f"{k} {v}" for k, v in meta.items()))
EOF

# --- the steps, each with its own time limit; a failed step does not stop the next
step() {  # step NAME TIMEOUT_S COMMAND...
  local name="$1" limit="$2" t rc; shift 2
  t=$(date +%s)
  echo "== gpu_check: $name (limit ${limit} s)"
  (cd "$ROOT" && timeout --kill-after=10 "$limit" "$@") 2>&1 | tee "$OUT/logs/$name.log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$OUT/steps.tsv"
  echo "== gpu_check: $name exit $rc after $(( $(date +%s) - t )) s"
}
step mla "${GPU_CHECK_MLA_TIMEOUT:-150}" "$PY" bench/gpu_check_mla.py --out "$OUT" --work "$WORK/mla" \
  --device "$DEVICE" $SMALL
rm -rf "$WORK/mla"
step extract "${GPU_CHECK_EXTRACT_TIMEOUT:-270}" "$PY" bench/gpu_check_extract.py --out "$OUT" --work "$WORK/extract" \
  --device "$DEVICE" $SMALL
rm -rf "$WORK/extract"

(cd "$ROOT" && "$PY" bench/gpu_check_report.py "$OUT") > "$OUT/logs/report.log" 2>&1
RC=$?
cat "$OUT/logs/report.log"
echo "gpu_check: $( [ $RC = 0 ] && echo PASS || echo FAIL ) in $(( $(date +%s) - T0 )) s; results in $OUT/results.md"
exit $RC
