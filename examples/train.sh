#!/bin/bash
#AIR --job-name=tiny-train
#AIR --nodes=2
#AIR --gpus-per-node=2
#AIR --time=10:00
#SBATCH --output=air-%j.out
# A 2-node job: the allocation, then a small real torch training run with one rank per GPU
# (4 gloo ranks on the CPU here), launched on both nodes by airrun.
echo "job $AIR_JOB_ID ($AIR_JOB_NAME) on $AIR_NNODES nodes: $AIR_JOB_NODELIST"
echo "batch script on $AIR_NODENAME with CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
airrun --label bash -c 'echo "rank $RANK of $WORLD_SIZE on $AIR_NODENAME, local rank $LOCAL_RANK, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
airrun --label python train_tiny.py
