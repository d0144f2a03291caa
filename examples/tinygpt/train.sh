#!/bin/bash
#AIR --job-name=tinygpt
#AIR --nodes=2
#AIR --gpus-per-node=2
#AIR --ntasks-per-node=2
#AIR --time=30:00
#AIR --output=tinygpt-%j.out
# tinygpt on 2 nodes x 2 ranks, launched by airrun; resumable: preempt it, kill a node, it goes on.
# exec: airrun takes the shell's place, so a stop signal reaches it and its exit code is the job's
exec airrun python "$AIR_SUBMIT_DIR/tinygpt/train.py" --checkpoint-dir "$AIR_SUBMIT_DIR/tinygpt-ckpt" "$@"
