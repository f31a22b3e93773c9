"""Train a snapshot model (EvolveGCN-O by default) for link prediction, on 1 or N processes.

    python examples/dtdg/train_link_pred.py                         # twitter_tennis_rg17
    torchrun --nproc_per_node=2 examples/dtdg/train_link_pred.py --model tgcn
    python examples/dtdg/train_link_pred.py --data bitcoin-alpha --span month

How this differs from EvolveGCN's link-prediction setup (IBM code):

* node features are the file's features on a log scale plus each node's in/out degree
  in each snapshot (of the full graph); the IBM code uses degree one-hots;
* each label snapshot's edges are scored against corrupted-source negatives
  (``(u', v)`` for each true ``(u, v)``; 1 per positive in training, 20 in
  evaluation), deterministic per (seed, split, snapshot) and the same for any number
  of processes; the IBM code scores all non-edges in evaluation;
* the scorer is a 2-layer MLP on ``[h_u || h_v || h_u * h_v]`` with one logit (BCE);
* AP and AUC are computed once over the WHOLE test split (1 negative per positive),
  gathered from all ranks; MRR ranks each positive among its 20 negatives; the
  trivial baseline (repeat the last snapshot) is scored on the same pairs;
* each rank computes the loss of the edges into its own nodes, normalised by global
  counts, and gradients are summed across ranks: N processes follow 1 process's path.
  Training runs in float64 by default: in float32 the summation-order roundoff of
  1 vs N processes grows over epochs on this data (~1e-3 AP after 2 epochs, ~2 points
  after 15); in float64 1 and 2 processes give the same metrics. ``--dtype float32`` is faster.

Ends with ONE line of JSON on rank 0.
"""
from _common import run

if __name__ == "__main__":
    run(__doc__, "link_pred", data="twitter_tennis_rg17", model="evolvegcn-o", hist_len=10,
        lr=0.01, epochs=30, lags=4, dtype="float64")
