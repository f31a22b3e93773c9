"""Train a snapshot model (EvolveGCN-O by default) for node regression, on 1 or N processes.

    python examples/dtdg/train_node_regression.py                   # england_covid
    torchrun --nproc_per_node=2 examples/dtdg/train_node_regression.py --model gconvgru
    python examples/dtdg/train_node_regression.py --data chickenpox --lags 4

How this differs from PyTorch Geometric Temporal's recurrent-GCN examples:

* windows of ``--hist-len`` snapshots ``[t-h+1 .. t]`` predict ``y[:, t]`` (the
  features of snapshot t hold only the ``--lags`` earlier values, as PGT builds them),
  one optimiser step per window, instead of one pass over the whole sequence;
* the series is standardised per node for every signal file (PGT: England COVID only);
* the test MSE is over every (node, test snapshot) pair, gathered from all ranks; the
  trivial baseline predicts the previous value ``y[:, t-1]``;
* each rank computes its own nodes; gradients are summed across ranks, so N
  processes follow 1 process's path.

Ends with ONE line of JSON on rank 0.
"""
from _common import run

if __name__ == "__main__":
    run(__doc__, "node_regression", data="england_covid", model="evolvegcn-o", hist_len=4,
        lr=0.01, epochs=50, lags=8)
