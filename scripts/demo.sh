#!/usr/bin/env bash
# The demo: a local cluster of 2 nodes with 4 simulated GPUs each, a 2-node training job
# from examples/, airq while it runs, and its output at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
dir=$(mktemp -d /tmp/air-demo.XXXX)
chmod 755 "$dir"
aircontrol local down --dir "$dir/cluster" >/dev/null 2>&1 || true
aircontrol local up --nodes 2 --gpus-per-node 4 --dir "$dir/cluster" --base-address 127.0.0.1
export AIR_CONF="$dir/cluster/air.toml"
trap 'aircontrol local down --dir "$dir/cluster"' EXIT
echo; airinfo; echo
cp examples/train.sh examples/train_tiny.py "$dir/"
cd "$dir"
job=$(airbatch --parsable train.sh)
echo "Submitted batch job $job"
while [ "$(airq -j "$job" -h -o %t)" = PD ]; do sleep 0.2; done
echo; airq; echo
while airq -j "$job" -h -o %t | grep -qE '^(R|CG)$'; do sleep 0.5; done
echo; airq -j "$job"; echo
aircontrol show job "$job"
echo; echo "== $dir/air-$job.out"; cat "air-$job.out"
[ "$(airq -j "$job" -h -o %T)" = COMPLETED ]
