#!/usr/bin/env bash
# GPU check for rollbox: on a machine with an NVIDIA GPU, run nvidia-smi and a small torch
# matmul inside a gVisor sandbox (runsc --nvproxy), then try a memory snapshot of a sandbox
# that holds GPU memory. Prints progress on stderr and ONE JSON line on stdout.
#
#   sudo bench/gpu_check.sh            # uses runsc from PATH, or ./runsc next to this script
#
# It needs no network: the sandbox's root filesystem is the host's own, read-only (so the
# host's nvidia-smi, driver libraries, python3 and torch are what runs inside), and the GPU
# device nodes are passed in the OCI spec. Torch is optional: without it that step is
# reported as skipped. Everything it makes lives under a temp directory and is removed.
# nvproxy: https://gvisor.dev/docs/user_guide/gpu/
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
RUNSC=${RUNSC:-$(command -v runsc || echo "$here/runsc")}
work=$(mktemp -d /tmp/rollbox-gpu.XXXXXX)
root="$work/state"
mkdir -p "$root"
log() { echo "[gpu_check] $*" >&2; }
json_escape() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))'; }
cleanup() {
    for id in gpu-smi gpu-torch gpu-hold gpu-restored; do "$RUNSC" --root "$root" delete -force "$id" >/dev/null 2>&1; done
    rm -rf "$work"
}
trap cleanup EXIT

result() {  # key=value pairs -> one JSON object
    python3 - "$@" <<'PY'
import json, sys
out = {}
for kv in sys.argv[1:]:
    k, _, v = kv.partition("=")
    try:
        out[k] = json.loads(v)
    except ValueError:
        out[k] = v
print(json.dumps(out))
PY
}

if ! command -v nvidia-smi >/dev/null || [ ! -e /dev/nvidiactl ]; then
    result ok=false error='"no NVIDIA GPU or driver on this machine (nvidia-smi, /dev/nvidiactl)"'
    exit 0
fi
if [ ! -x "$RUNSC" ]; then
    result ok=false error='"runsc not found: install gVisor (bookworm-backports) or put runsc next to this script"'
    exit 0
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
runsc_version=$("$RUNSC" --version | head -1)
log "GPU: $gpu_name, driver $driver, $runsc_version"

# One OCI bundle per run: the host root read-only, a tmpfs /tmp, the NVIDIA devices.
bundle() {  # name, argv as a JSON list
    local d="$work/$1"
    mkdir -p "$d"
    python3 - "$d" "$2" <<'PY'
import glob, json, os, stat, sys
d, argv = sys.argv[1], json.loads(sys.argv[2])
devs = []
for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *sorted(glob.glob("/dev/nvidia[0-9]*"))]:
    if os.path.exists(p):
        st = os.stat(p)
        devs.append({"path": p, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                     "fileMode": stat.S_IMODE(st.st_mode), "uid": 0, "gid": 0})
spec = {"ociVersion": "1.0.0",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": argv, "cwd": "/",
                    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "NVIDIA_VISIBLE_DEVICES=all", "HOME=/tmp"]},
        "root": {"path": "/", "readonly": True},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
                  "devices": devs}}
json.dump(spec, open(os.path.join(d, "config.json"), "w"))
PY
    echo "$d"
}
RUN=("$RUNSC" --root "$root" --platform=systrap --network=none --nvproxy)

# 1. nvidia-smi inside the sandbox.
t0=$(date +%s.%N)
smi_out=$("${RUN[@]}" run --bundle "$(bundle smi '["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]')" gpu-smi 2>"$work/smi.err")
smi_rc=$?
smi_s=$(python3 -c "import time; print(round(time.time() - $t0, 2))")
log "nvidia-smi in gVisor: rc=$smi_rc: $smi_out $(tail -c 300 "$work/smi.err")"

# 2. A small torch matmul on the GPU inside the sandbox (skipped without torch on the host).
torch_rc=-1; torch_out="skipped: no torch on the host"
if python3 -c "import torch" 2>/dev/null; then
    prog='import torch, time; a = torch.randn(4096, 4096, device="cuda"); torch.cuda.synchronize(); t = time.time(); c = a @ a; torch.cuda.synchronize(); print(torch.cuda.get_device_name(0), round(time.time() - t, 4), float(c.sum()))'
    torch_out=$("${RUN[@]}" run --bundle "$(bundle torch "[\"python3\", \"-c\", $(printf '%s' "$prog" | json_escape)]")" gpu-torch 2>"$work/torch.err")
    torch_rc=$?
    log "torch matmul in gVisor: rc=$torch_rc: $torch_out $(tail -c 300 "$work/torch.err")"
fi

# 3. A memory snapshot of a sandbox holding GPU memory, and a restore of it.
ck_rc=-1; restore_rc=-1; ck_err="skipped: no torch on the host"
if python3 -c "import torch" 2>/dev/null; then
    hold='import torch, time; x = torch.ones(256, 1024, 1024, device="cuda"); torch.cuda.synchronize(); open("/tmp/ready", "w").write("1"); time.sleep(3600)'
    "${RUN[@]}" run -detach --bundle "$(bundle hold "[\"python3\", \"-c\", $(printf '%s' "$hold" | json_escape)]")" gpu-hold \
        </dev/null >"$work/hold.out" 2>"$work/hold.err"
    for _ in $(seq 120); do
        "$RUNSC" --root "$root" exec gpu-hold cat /tmp/ready >/dev/null 2>&1 && break
        sleep 1
    done
    mkdir -p "$work/ck"
    "$RUNSC" --root "$root" checkpoint --image-path "$work/ck" gpu-hold >"$work/ck.out" 2>"$work/ck.err"
    ck_rc=$?
    ck_err=$(tail -c 400 "$work/ck.err")
    if [ "$ck_rc" = 0 ]; then
        "${RUN[@]}" restore -detach --image-path "$work/ck" --bundle "$work/hold" gpu-restored \
            </dev/null >"$work/restore.out" 2>"$work/restore.err"
        restore_rc=$?
    fi
    log "checkpoint of a GPU-holding sandbox: rc=$ck_rc, restore rc=$restore_rc: $ck_err"
fi

result ok="$([ "$smi_rc" = 0 ] && echo true || echo false)" gpu="$(printf '%s' "$gpu_name" | json_escape)" \
    driver="$(printf '%s' "$driver" | json_escape)" runsc="$(printf '%s' "$runsc_version" | json_escape)" \
    nvidia_smi_rc="$smi_rc" nvidia_smi_s="$smi_s" nvidia_smi_out="$(printf '%s' "$smi_out" | json_escape)" \
    torch_rc="$torch_rc" torch_out="$(printf '%s' "$torch_out" | json_escape)" \
    gpu_checkpoint_rc="$ck_rc" gpu_restore_rc="$restore_rc" gpu_checkpoint_err="$(printf '%s' "$ck_err" | json_escape)"
