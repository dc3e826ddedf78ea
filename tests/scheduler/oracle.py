"""A synthetic pass-rate oracle in place of the engine and the rewards, and a scheduler run against it;
the hypothesis strategy of scheduler settings the property tests draw from."""

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pc_megatron.scheduler import Sample, Scheduler, SchedulerConfig


class Oracle:
    """Prompt i is correct with probability p_i; the k-th sample ever drawn for a prompt is a
    fixed function of (seed, i, k), so any call order gives each prompt the same outcomes."""

    def __init__(self, num_prompts: int, seed: int):
        rng = random.Random(seed)
        # the paper's regime: many prompts solved or hopeless, some in between
        self.p = [rng.choice([0.0, 0.0, 0.05, 0.3, 0.5, 0.7, 0.95, 1.0, 1.0]) for _ in range(num_prompts)]
        self.drawn = [0] * num_prompts
        self.seed = seed
        self.version = 0
        self.requests = []

    def __call__(self, requests):
        self.requests.append([(r.prompt, r.n, r.phase, self.version) for r in requests])
        out = []
        for r in requests:
            samples = []
            for _ in range(r.n):
                u = random.Random(f"{self.seed}/{r.prompt}/{self.drawn[r.prompt]}").random()
                self.drawn[r.prompt] += 1
                ok = u < self.p[r.prompt]
                tokens = 1 + (r.prompt + self.drawn[r.prompt]) % 5
                samples.append(Sample(correct=ok, reward=float(ok), policy_version=self.version, tokens=tokens))
            out.append(samples)
        return out


def run(cfg, steps, num_prompts=40, B=4, n=8, seed=0, oracle_seed=1):
    sched, oracle = Scheduler(cfg, num_prompts, B, n, seed), Oracle(num_prompts, oracle_seed)
    history = []
    for step in range(steps):
        oracle.version = step
        batch = sched.next_batch(step, oracle, policy_version=step)
        buffered_tokens = sum(s.tokens for e in [*sched.pool.buffer.values(), *sched.policy.pending] for s in e.samples)
        history.append(
            (batch, dict(sched.pool.counts), dict(sched.pool.state), sched.buffered_samples(), buffered_tokens)
        )
    return sched, oracle, history


configs = st.builds(
    SchedulerConfig,
    policy=st.sampled_from(["grpo", "dapo", "pilot_commit", "adaptive"]),
    gen_prompts_multiplier=st.integers(1, 3),
    buffer_capacity=st.integers(0, 12),
    max_off_steps=st.integers(0, 4),
    selection=st.sampled_from(["random", "max_variance"]),
    bind=st.booleans(),
    max_rounds=st.integers(1, 4),
    request_multiple=st.sampled_from([1, 1, 3, 8]),
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
