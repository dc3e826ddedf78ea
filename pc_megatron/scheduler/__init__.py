"""Rollout allocation: which prompts get how many samples each step.

One ``Scheduler.next_batch`` call fills one training batch of up to ``B`` groups, calling
``generate(requests)`` one or more times (rounds), under one of the policies (``policies/``):

- ``grpo``: one round, ``B`` fresh prompts x ``n`` samples; every group is trained.
- ``dapo``: rounds of ``B_gen`` fresh prompts x ``n``; groups with zero reward spread are
  dropped, mixed groups kept until ``B``; the surplus is discarded (all generated rollouts count).
- ``pilot_commit``: pilot ``B_gen`` fresh prompts x ``n_p``; keep ``p_lower <= p̂ <= p_upper``
  in the replay buffer, evict at ``p̂ >= p_evict``, defer too-hard prompts to the next epoch,
  skip the other too-easy ones this epoch; commit ``n_c`` more samples to up to ``B`` buffered
  prompts; the trained group is pilot ∪ commit. With ``bind``, commit(t) and the pilot that
  feeds t+1 share one generate call.
- ``adaptive``: pilots sized and skipped by each prompt's pass-rate posterior (``belief.py``),
  full groups without a pilot where the posterior says the group will be mixed, at most
  ``adaptive_budget`` x B x n rollouts an update.

Rounds repeat while the batch is short, up to ``max_rounds``; then the batch is trained as it
is (possibly empty) instead of the public recipe's hard error. Randomness is drawn from
streams keyed by (seed, epoch) and (seed, step, round), so it does not depend on call order:
bound and unbound modes see the same prompts, and a restored scheduler continues exactly.

The modules: ``types.py`` (what goes in and out), ``config.py`` (``scheduler.*``), ``pool.py``
(prompt states, epochs, replay buffer, accounting), ``policies/`` (one class a policy, each with
what it carries between steps), ``core.py`` (the scheduler: pool and policy composed, the step's
statistics, the checkpoint), ``belief.py`` (the adaptive policy's posteriors), ``simulate.py``
(allocation on fixed pass rates). Pure Python, engine- and learner-agnostic, deterministic given a
seed; its whole state is a picklable dict for checkpoints. No torch model code is imported here.
"""

from pc_megatron.scheduler.config import PolicyName, SchedulerConfig
from pc_megatron.scheduler.core import Scheduler
from pc_megatron.scheduler.policies import POLICIES, pass_rate_lower_bound
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, Group, OnGroup, Sample

__all__ = [
    "POLICIES",
    "Allocation",
    "Entry",
    "GenRequest",
    "GenerateFn",
    "Group",
    "OnGroup",
    "PolicyName",
    "Sample",
    "Scheduler",
    "SchedulerConfig",
    "pass_rate_lower_bound",
]
