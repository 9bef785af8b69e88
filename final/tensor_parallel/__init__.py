"""`serve --tensor-parallel-size N`: the server's engine with its model cut over N processes
(stage 07's tensor_parallel room). This process is rank 0: the server, the scheduler, the sampler,
speculation and grammars; ranks 1..N-1 run the same forward on their shards.
`start.py` refuses what does not combine, sets the kernel options TP runs with, and starts the ranks.
"""
