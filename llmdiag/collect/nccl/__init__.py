"""The NCCL benchmark's measurements: collective bandwidth as nccl-tests measures it, from inside PyTorch.

    options     the arguments, checked before anything starts (pure)
    busbw       nccl-tests' arithmetic: bus factors, buffer sizes, the median trial (pure)
    bench       what each rank runs under torchrun: the environment, the link, the size cap, the measurement
    collectives the collectives themselves, their timing, and the one-rank memory-copy probe (torch)
    signals     a report as the signals the network rules judge
    launch      torchrun on this host, and rank 0's report read back

torch is imported only by ``bench`` and ``collectives``, which run under torchrun; the rest loads without it.
"""
