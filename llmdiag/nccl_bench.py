"""`torchrun -m llmdiag.nccl_bench`: the NCCL benchmark on each rank, for runs that `llmdiag nccl-bench` does not
launch (several nodes, a scheduler's own torchrun). The command line is llmdiag.cli.nccl_rank."""

import sys

from llmdiag.cli.nccl_rank import main

if __name__ == "__main__":
    sys.exit(main())
