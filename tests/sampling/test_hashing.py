"""Counter-based hashing (tgl_dist/sampling/hashing.py): SplitMix64 bits, and Python-int keys
hashing exactly as one-element tensors do."""
import pytest
import torch

from tgl_dist.sampling._ckernel import get_kernel
from tgl_dist.sampling.hashing import GOLDEN, hash_keys, mix64, mix64_int, uniform_below, wrap64


def _reference(seed, *keys):
    """hash_keys with every key a tensor (the original formulation)."""
    h = mix64(torch.tensor(wrap64(int(seed)), dtype=torch.long) + GOLDEN)
    for k in keys:
        h = mix64((h ^ k.to(torch.long)) + GOLDEN)
    return h


def test_mix64_is_splitmix64():
    # SplitMix64's first outputs from state 0 (the reference generator adds GOLDEN, then mixes)
    want = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    state = 0
    for w in want:
        state = (state + (GOLDEN & ((1 << 64) - 1))) & ((1 << 64) - 1)
        assert mix64_int(state) == wrap64(w)
        assert int(mix64(torch.tensor(wrap64(state)))) == wrap64(w)


def test_int_keys_hash_as_tensor_keys():
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        seed, a, b = (int(x) for x in torch.randint(-2 ** 63, 2 ** 63 - 1, (3,), generator=g))
        b = [b, -1, 0, 7][trial % 4]
        t = torch.randint(-2 ** 63, 2 ** 63 - 1, (6,), generator=g)
        assert int(hash_keys(seed, a, b)) == int(_reference(seed, torch.tensor(a), torch.tensor(b)))
        assert torch.equal(hash_keys(seed, a, t), _reference(seed, torch.tensor(a), t))
        assert torch.equal(hash_keys(seed, t.view(2, 3), t[:3]), _reference(seed, t.view(2, 3), t[:3]))
    assert hash_keys(5, 1).dtype == torch.long and hash_keys(5, 1).dim() == 0


def test_kernel_draws_are_the_torch_draws():
    """The sampling kernel's one-pass draws (negatives) give uniform_below(hash_keys(...))'s
    values bit for bit: extreme seeds and keys, one or many counters, small and huge n."""
    kern = get_kernel()
    if kern is None:
        pytest.skip("TGL_DIST_NO_KERNEL=1 or no C compiler: the sampling kernel is not built")
    g = torch.Generator().manual_seed(1)
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (257,), generator=g)
    keys[:5] = torch.tensor([0, -1, 2 ** 63 - 1, -2 ** 63, 7])
    for seed in (0, -7, 2 ** 63 - 1, -2 ** 63, 123456789):
        for k in (1, 3, 50):
            for n in (1, 7, 9227, 2 ** 40 + 3):
                want = uniform_below(hash_keys(seed, keys.view(1, -1), torch.arange(k).view(k, 1)),
                                     torch.tensor(n))
                assert torch.equal(kern.draw_below(seed, keys, k, n), want)
    assert kern.draw_below(3, keys[:0], 2, 5).shape == (2, 0)
