"""Communication analysis of PyTorch profiler traces: per rank, across ranks, and the signals the rules judge.

Per rank, over GPU activity (kernels, memcpy, memset, all streams of the device):

- busy = union of all activity; span = first start to last end; idle = span − busy
- comm = union of communication kernels (probes/collectives.toml: NCCL, RCCL, and the all-reduce kernels that
  are not NCCL: PyTorch symmetric memory, vLLM custom and quick all-reduce); compute = union of the other kernels;
  memcpy/memset are neither (as HTA counts them)
- comm share = comm / busy; exposed comm = comm − compute (communicating while no compute runs), as a share of the
  span; overlap = (comm ∩ compute) / comm, HTA's comp_comm_overlap

CPU-only runs (gloo, no GPU activity) are measured on the CPU instead (``RankStats.timeline == "cpu"``): comm = union
of the ``gloo:*`` ranges (they run on the gloo worker threads and last for the real execution, waiting for peers
included); compute = union of the ``cpu_op`` ranges on the other threads, less the ops that issue collectives;
busy, span and the shares as above. Each ``gloo:*`` range is typed by the ``c10d::*`` op that issued it (gloo runs
``reduce_scatter_tensor`` as an all-reduce, so the annotation alone would say all_reduce), and sized from its own
``Input Dims`` × dtype (gloo events carry no collective args).

Across ranks, the k-th collective of each (process group, type) is matched on every rank; the rank that starts
them last is the straggler: its peers wait inside their kernels for it. HTA's way (``hta_compat``): timestamps
rounded as HTA does (start up, end down, to whole µs), the last ProfilerStep dropped, and only ``nccl…Kernel``
names counted as communication, so the numbers can be set beside HTA's.

The reader (``reader``) is kept apart from the analysis (``analysis``, ``collectives``), as HolisticTraceAnalysis
keeps its parser apart from its analyzers.
"""
