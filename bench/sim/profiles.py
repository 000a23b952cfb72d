"""Fleet profiles: how many replicas, what each can hold and run, and how
fast the workload arrives, for the replay through nginx (bench.py, the
mock replicas) and the offline simulator (bounds.py) alike.

    roomy   4 replicas of 32 running slots and 4M tokens of KV cache each,
            the workload at its own rate: the benchmark as it was, where
            nothing is ever evicted
    tight   8 replicas of 4 running slots, a KV cache per replica of a
            quarter of the workload's distinct prompt blocks divided by 8
            (the fleet as a whole holds a quarter of them), the workload
            at 1.2 times its rate: caches under pressure, running slots
            about 80 % busy on the conversation and chat workloads.  At 4
            times the rate, conversation, chat and shared-docs ask for 2
            to 3 times the fleet's decode capacity: every policy's queue
            then grows for the whole run and TTFT measures the run's
            length, not the routing
    mixed   the tight fleet with every other replica slow_factor (2.5)
            times slower in prefill and decode: two GPU generations, or
            two tensor-parallel sizes, behind one upstream.  The fleet
            then does 0.7 of the tight fleet's work in a second, so the
            workload arrives at 0.85 times its rate (1.2 x 0.7): as
            busy as the tight fleet, not overloaded

A tight cache is computed from the workload itself: distinct prompt blocks
are the distinct model blocks (model.BLOCK_TOKENS tokens, chained hashes of
the mock's prompt text) over all the requests of the workload slice, which
bounds.py counts (bounds.distinct_blocks).
"""

from dataclasses import asdict, dataclass, replace

from . import model


@dataclass(frozen=True)
class Profile:
    name: str
    replicas: int
    max_running: int
    rate_multiplier: float      # arrivals at this many times the own rate
    cache_share: float = None   # share of the workload's distinct blocks
                                # the fleet holds; None: cache_tokens
    cache_tokens: int = None    # per replica, when cache_share is None
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 20.0
    slow_share: float = 0.0     # share of the replicas that are slower
    slow_factor: float = 1.0    # by this factor (fleet.slowed())

    def slowdowns(self):
        """Each replica's slowdown: the slow ones spread evenly over the
        fleet (every other one at a half), so that no ring or rotation
        order favours either kind."""
        slow = int(round(self.slow_share * self.replicas))
        marks = [1.0] * self.replicas
        for k in range(slow):
            marks[int((k + 0.5) * self.replicas / slow)] = self.slow_factor
        return marks

    def replica_cache_tokens(self, distinct_blocks):
        """KV cache tokens per replica for a workload of distinct_blocks
        distinct prompt blocks: cache_share of them over the replicas,
        in whole blocks (at least one)."""
        if self.cache_share is None:
            return self.cache_tokens
        blocks = int(self.cache_share * distinct_blocks / self.replicas)
        return max(1, blocks) * model.BLOCK_TOKENS

    def replica_params(self, distinct_blocks, time_scale=1.0):
        """The replicas' model.ReplicaParams for that workload."""
        return model.ReplicaParams(
            max_running=self.max_running,
            prefill_ms_per_token=self.prefill_ms_per_token,
            decode_ms_per_token=self.decode_ms_per_token,
            cache_tokens=self.replica_cache_tokens(distinct_blocks),
            time_scale=time_scale)

    def describe(self):
        return asdict(self)


PROFILES = {
    'roomy': Profile('roomy', replicas=4, max_running=32,
                     rate_multiplier=1.0, cache_tokens=4194304),
    'tight': Profile('tight', replicas=8, max_running=4,
                     rate_multiplier=1.2, cache_share=0.25),
    'mixed': Profile('mixed', replicas=8, max_running=4,
                     rate_multiplier=0.85, cache_share=0.25,
                     slow_share=0.5, slow_factor=2.5),
}
# Without a profile, the simulator's old defaults: one GPU's KV cache.
CUSTOM = Profile('custom', replicas=4, max_running=32, rate_multiplier=1.0,
                 cache_tokens=model.ReplicaParams.cache_tokens)

# Options that override a profile's values, and the field each sets.
OPTIONS = (('--replicas', 'replicas', int),
           ('--max-running', 'max_running', int),
           ('--rate-multiplier', 'rate_multiplier', float),
           ('--cache-share', 'cache_share', float),
           ('--cache-tokens', 'cache_tokens', int),
           ('--prefill-ms-per-token', 'prefill_ms_per_token', float),
           ('--decode-ms-per-token', 'decode_ms_per_token', float),
           ('--slow-share', 'slow_share', float),
           ('--slow-factor', 'slow_factor', float))


def add_profile_arguments(parser):
    """--profile and the options that override its values."""
    parser.add_argument('--profile', choices=sorted(PROFILES),
                        help='fleet profile (profiles.py); without one: '
                             '4 replicas, 32 running slots, 256k-token '
                             'caches, the own rate')
    for option, name, kind in OPTIONS:
        parser.add_argument(option, dest=name, type=kind, default=None,
                            help='overrides the profile\'s %s' % name)


def from_args(args):
    """The profile the options select, overrides applied.  --cache-tokens
    alone makes the cache a fixed size, --cache-share a share of the
    workload's blocks."""
    profile = PROFILES[args.profile] if args.profile else CUSTOM
    changes = {name: getattr(args, name) for _, name, _ in OPTIONS
               if getattr(args, name, None) is not None}
    if 'cache_tokens' in changes and 'cache_share' not in changes:
        changes['cache_share'] = None
    if 'cache_share' in changes and changes['cache_share'] is None \
            and 'cache_tokens' not in changes \
            and profile.cache_tokens is None:
        raise ValueError('a fixed cache needs --cache-tokens')
    if changes:
        profile = replace(profile, **changes)
    return profile
