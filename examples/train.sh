#!/bin/bash
#AIR --job-name=tiny-train
#AIR --nodes=2
#AIR --gpus-per-node=2
#AIR --time=10:00
#SBATCH --output=air-%j.out
# A 2-node job: where each part of the allocation is, then a small real torch training run
# on the batch node (two gloo ranks on the CPU).
echo "job $AIR_JOB_ID ($AIR_JOB_NAME) on $AIR_NNODES nodes: $AIR_JOB_NODELIST"
echo "batch script on $AIR_NODENAME with CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
for node in $(aircontrol show hostnames "$AIR_JOB_NODELIST"); do
  echo "  allocated: $node"
done
aircontrol show job "$AIR_JOB_ID" | grep -E 'GpuIndices|NodeList'
python train_tiny.py
