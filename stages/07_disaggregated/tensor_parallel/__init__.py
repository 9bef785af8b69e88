"""Tensor parallelism: one model cut across N processes (ranks), each holding 1/N of every layer.
See stage 07's README, section "Tensor parallelism", for the lesson; files in reading order:

* sharding.py: which rows and columns of each weight a rank keeps (Megatron-LM's split);
* layers.py: the layers that talk: row-parallel linears (an all-reduce), the vocab-parallel
  embedding (an all-reduce) and lm_head (an all-gather of the logits);
* comm.py: the counted collectives over torch.distributed (gloo on the CPU, NCCL on CUDA);
* channel.py: rank 0 runs the engine and broadcasts each step; the others follow;
* launch.py: one process per rank (torch.multiprocessing or torchrun), watchdogs, clean exit;
* cli.py: stage 01's command-line contract with --tensor-parallel-size;
* bench_tensor_parallel.py: a step's collectives and bytes against the weight bytes a rank saves,
  measured with gloo, computed for NVLink and PCIe;
* testing.py: the tests' tiny model (its widths split in two, its vocabulary does not).
"""
