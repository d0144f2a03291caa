#!/usr/bin/env bash
# The demo: a local cluster of 2 nodes with 4 simulated GPUs each, and examples/tinygpt trained on
# it with 2 ranks per node (gloo on the CPU). Half way, a job of a higher QOS preempts it: tinygpt
# checkpoints at a step all ranks agree on, goes back to the queue, resumes from that step and
# finishes. airq -l shows its progress along the way; airstat draws its loss at the end, and
# aircontrol show job where its time went.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
dir=$(mktemp -d /tmp/air-demo.XXXX)
chmod 755 "$dir"
cat > "$dir/qos.toml" <<'EOF'
[scheduler]
preempt_grace_s = 60

[[qos]]
name = "normal"

[[qos]]
name = "high"
priority = 10
preempt = ["normal"]
EOF
echo "users = [\"$(id -un)\"]   # who may use QOS high (a QOS that preempts names its users)" >> "$dir/qos.toml"
aircontrol local up --nodes 2 --gpus-per-node 4 --dir "$dir/cluster" --base-address 127.0.0.1 \
    --extra-config "$dir/qos.toml"
export AIR_CONF="$dir/cluster/air.toml"
trap 'aircontrol local down --dir "$dir/cluster"' EXIT
echo; airinfo; echo
cp -r examples/tinygpt "$dir/"
cd "$dir"
steps=${DEMO_STEPS:-160}
job=$(airbatch --parsable tinygpt/train.sh --steps "$steps" --every 20 --layers 4 --width 128)
echo "Submitted batch job $job: tinygpt, $steps steps, 2 nodes x 2 ranks"
step() { airq -j "$job" -h -o %s; }
wait_step() { while [ "$(step)" = - ] || [ "$(step)" -lt "$1" ]; do sleep 1; done; }
wait_step $((steps / 3))
echo; airq -l; echo
echo "== a job of QOS high needs every GPU: it preempts tinygpt"
boss=$(airbatch --parsable --qos=high --nodes=2 --gpus-per-node=4 --wrap 'sleep 5')
while [ "$(airq -j "$job" -h -o %t)" = R ]; do sleep 0.5; done
airq; echo
while [ "$(airq -j "$boss" -h -t all -o %t)" != CD ]; do sleep 0.5; done
echo "== the preempting job is done; tinygpt resumes from its checkpoint"
wait_step $((2 * steps / 3))
echo; airq -l; echo
while airq -j "$job" -h -o %t | grep -qE '^(PD|R|CG)$'; do sleep 1; done
aircontrol show job "$job" | grep -E "JobState|Restarts"
echo; echo "== $dir/tinygpt-$job.out"; cat "tinygpt-$job.out"
echo; airstat "$job" --width 80 || true
echo; echo "== where its time went (goodput), and its runs"
aircontrol show job "$job" | grep -E "Goodput"
airacct -j "$job" -D -X -o JobID,State,Elapsed,Goodput,TrainTime,CkptTime,RestoreTime,StartupTime,DownTime,LostWork
[ "$(airq -j "$job" -h -t all -o %T)" = COMPLETED ]
