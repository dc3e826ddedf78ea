"""The prompt sampler (``pc_megatron/data/sampler.py``): epochs are permutations, and a restored sampler
continues exactly."""

from pc_megatron.data.sampler import PromptSampler


def test_sampler_resumes_exactly_across_epochs():
    s = PromptSampler(10, seed=3)
    first = s.next_batch(7)
    state = s.state_dict()
    rest = s.next_batch(12)
    t = PromptSampler(10, seed=3)
    t.load_state_dict(state)
    assert t.next_batch(12) == rest
    assert sorted(first + rest[:3]) == list(range(10))  # each epoch is a permutation
