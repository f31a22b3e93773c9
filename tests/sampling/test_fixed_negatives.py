"""FixedNegatives: each event's pre-generated list, padded and masked, j-major."""
import pytest
import torch

from tgl_dist.data.loaders.tgb import TGBNegatives
from tgl_dist.sampling.fixed import FixedNegatives


def _table():
    # events 3, 5, 8; event 5's list is short (TGB's small pool), -1 padded
    return TGBNegatives("test", torch.tensor([3, 5, 8]),
                        torch.tensor([[10, 11, 12], [13, -1, -1], [14, 15, 16]]))


def test_rows_are_j_major_with_padding_replaced_and_masked():
    b = FixedNegatives(_table(), width=4).bind("test", False)
    neg, mask = b.rows(torch.tensor([8, 5]), torch.tensor([7, 6]))
    assert neg.shape == mask.shape == (4, 2)                 # [q, B]: negative j of event i
    assert neg.t().tolist() == [[14, 15, 16, 7], [13, 6, 6, 6]]
    assert mask.t().tolist() == [[True, True, True, False], [True, False, False, False]]
    empty, m = b.rows(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert empty.shape == m.shape == (4, 0)


def test_bad_use_is_named():
    with pytest.raises(ValueError, match="width 2 is below the table's 3"):
        FixedNegatives(_table(), width=2)
    with pytest.raises(ValueError, match="evaluation negatives"):
        FixedNegatives(_table()).bind("train", True)
    b = FixedNegatives(_table()).bind("val", False)
    with pytest.raises(KeyError, match="split 'val'.*must cover this rank's events"):
        b.rows(torch.tensor([4]), torch.tensor([0]))
    none = torch.zeros(0, dtype=torch.long)
    empty = TGBNegatives("val", none, none.view(0, 0))
    neg, _ = FixedNegatives(empty, width=3).bind("val", False).rows(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert neg.shape == (3, 0)                               # a rank without events of the split
