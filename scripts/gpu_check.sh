#!/usr/bin/env bash
# On a host with NVIDIA GPUs and AIR installed (its tools on PATH, torch with CUDA): read the GPUs
# through AIR's NVML backend (inventory, health, NVLink, telemetry), bring up a one-node local
# cluster on them (aircontrol local up --nvml), and run real GPU jobs on it: a job that looks at
# what it was given, and tinygpt on one GPU with NCCL, requeued half way and resumed from its
# checkpoint. Prints what it saw; exits non-zero if a step failed.
#
#     bash scripts/gpu_check.sh [WORKDIR]
# (AIR_GPU_CHECK_SIM=1: simulated GPUs and no NVML, to try the script itself on a host without GPUs.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/air-gpu.XXXX)}
mkdir -p "$work"
chmod 755 "$work"
say() { echo; echo "== $*"; }

say "host"
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader || true
echo "cgroup filesystem: $(stat -fc %T /sys/fs/cgroup)"
[ -d /sys/fs/cgroup/devices ] && echo "cgroup v1 devices controller: present" || echo "cgroup v1 devices controller: absent"

say "AIR's NVML backend"
[ -n "${AIR_GPU_CHECK_SIM:-}" ] || python3 - <<'EOF'
import time
from air.airnoded.gpus import NvmlGpus
g = NvmlGpus()
for gpu in g.inventory():
    print(f"GPU {gpu.index}: {gpu.name}, {gpu.memory_mb} MiB, {gpu.uuid}")
print("device minors:", g.device_minors())
print("health events now:", [(e.gpu, e.signal, e.message) for e in g.faults(time.time())] or "none")
states = g.link_states()
print(f"NVLink links read: {len(states)}, active: {sum(states.values())}")
errors = {k: v for k, v in g.link_errors().items() if v}
print("NVLink error counters (non-zero):", errors or "none")
print("uncorrected ECC (volatile):", g.ecc_uncorrected())
for s in g.telemetry():
    print(f"GPU {s.index}: {s.utilization}% busy, {s.temperature_c} C, {s.power_w:.0f} W, {s.memory_used_mb} MiB used")
time.sleep(1)
print("XIDs seen by the event watcher:", g.take_xids() or "none")
EOF

say "a one-node local cluster on this host's GPUs"
gpus=(--nvml); [ -z "${AIR_GPU_CHECK_SIM:-}" ] || gpus=(--gpus-per-node 1)
aircontrol local up "${gpus[@]}" --nodes 1 --cpus-per-node 8 --dir "$work/cluster"
export AIR_CONF="$work/cluster/air.toml"
trap 'aircontrol local down --dir "$work/cluster" >/dev/null || true' EXIT
airinfo
aircontrol show node node01

wait_done() {   # job id, seconds
    local deadline=$((SECONDS + $2)) state
    while :; do
        state=$(airq -j "$1" -h -t all -o %T)
        case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) echo "job $1: $state"; [ "$state" = COMPLETED ]; return;; esac
        [ $SECONDS -lt $deadline ] || { echo "job $1 still $state after $2 s"; return 1; }
        sleep 0.5
    done
}

say "a job with one GPU: what it sees"
cd "$work"
job=$(airbatch --parsable --gpus-per-node=1 -o look-%j.out --wrap \
    'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS=$SLURM_JOB_GPUS"; nvidia-smi -L || true;
     python3 -c "import torch; n = torch.cuda.device_count(); print(\"torch sees\", n, \"GPU(s)\", *(torch.cuda.get_device_name(i) for i in range(n)))"')
wait_done "$job" 120
cat "look-$job.out"

say "tinygpt on one GPU (NCCL), requeued half way"
cp -r "$root/examples/tinygpt" "$work/"
steps=600
job=$(airbatch --parsable --nodes=1 --ntasks-per-node=1 --gpus-per-node=1 -o tinygpt-%j.out \
    tinygpt/train.sh --steps "$steps" --every 100 --layers 4 --width 256 --sleep 0.01)
step() { airq -j "$job" -h -o %s; }
deadline=$((SECONDS + 180))
while [ "$(step)" = - ] || [ "$(step)" -lt $((steps / 2)) ]; do
    state=$(airq -j "$job" -h -t all -o %T)
    if [ $SECONDS -ge $deadline ] || [ "$state" != PENDING ] && [ "$state" != RUNNING ]; then
        echo "tinygpt did not reach step $((steps / 2)) ($state)"; cat "tinygpt-$job.out"; exit 1
    fi
    sleep 0.5
done
airq -l
aircontrol requeue "$job"
wait_done "$job" 300
grep -i -E "nccl|resum|restor|step [0-9]+|cuda" "tinygpt-$job.out" | head -30 || true
tail -5 "tinygpt-$job.out"
aircontrol show job "$job"
echo; echo "gpu check: every step passed"
