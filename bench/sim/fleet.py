"""The replicas of the model and the state they go through, shared by the
mock replicas (mock_backend.py), which move requests through it in real
time, and the offline simulator (bounds.py), which moves them through
simulated time, so that both follow one set of rules (model.py for the
cache and the durations):

- a replica admits at most max_running requests; the others wait for a
  running slot in FIFO order;
- admitted requests take the replica's single prefill lane in FIFO order;
  when a request gets the lane its cached prefix is looked up, and prefill
  takes prefill_seconds() of the uncached tokens;
- when prefill ends the first token is out and the prompt's blocks go into
  the cache; decoding takes decode_seconds() of the output, concurrently
  with the other running requests, then the request frees its slot for the
  oldest waiting one.

A router sees the fleet's load: each replica's in-flight requests (running
and waiting) against the module's load bound.
"""

from collections import deque
from dataclasses import replace

from . import model

# What a replica counts, by name, with its Prometheus type and help (the
# mock's /metrics prefixes "mock_"; its /stats uses the names as they are).
METRICS = (
    ('requests_total', 'counter', 'Inference requests received.'),
    ('prompt_tokens_total', 'counter',
     'Prompt tokens of the inference requests received.'),
    ('queried_tokens_total', 'counter',
     'Prompt tokens looked up in the prefix cache (when prefill starts).'),
    ('cached_tokens_total', 'counter',
     'Prompt tokens served from the prefix cache.'),
    ('cache_hits_total', 'counter',
     'Requests whose prefill found at least one cached token.'),
    ('cache_misses_total', 'counter',
     'Requests whose prefill found no cached token.'),
    ('running', 'gauge', 'Requests admitted: prefilling or decoding.'),
    ('waiting', 'gauge', 'Requests waiting for admission.'),
    ('peak_inflight', 'gauge',
     'Highest running + waiting since start or the last reset.'),
    ('cache_blocks', 'gauge', 'Blocks held in the prefix cache.'),
)
COUNTERS = tuple(name for name, kind, _ in METRICS if kind == 'counter')

DEFAULT_FACTOR = 1.25
DEFAULT_SLACK = 2


class Slots:
    """`capacity` slots handed out strictly in arrival order.  What cannot
    have one now is queued, and handed the slot that a release frees.  The
    items are the owner's: jobs for the simulator, futures for the mock."""
    __slots__ = ('capacity', 'in_use', 'waiting')

    def __init__(self, capacity):
        self.capacity = capacity
        self.in_use = 0
        self.waiting = deque()

    def take(self, item):
        """True when item has a slot now; else it is queued, False."""
        if self.in_use < self.capacity and not self.waiting:
            self.in_use += 1
            return True
        self.waiting.append(item)
        return False

    def release(self):
        """Frees a slot: the oldest queued item has it now and is
        returned; None when nothing waits."""
        if self.waiting:
            return self.waiting.popleft()
        self.in_use -= 1
        return None

    def withdraw(self, item):
        """Takes item out of the queue, if it is still there."""
        if item in self.waiting:
            self.waiting.remove(item)


class Replica:
    """One replica: its cache, running slots, prefill lane and counters.
    Its owner moves each request through arrive(), lane.take(),
    start_prefill(), end_prefill(), and admission.release() when it
    finishes, and keeps the time."""

    def __init__(self, params, name=None):
        self.params = params
        self.name = name
        self.cache = model.PrefixCache(params.cache_blocks)
        self.admission = Slots(params.max_running)
        self.lane = Slots(1)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.peak_inflight = 0

    @property
    def inflight(self):
        """Requests running or waiting for a slot."""
        return self.admission.in_use + len(self.admission.waiting)

    def arrive(self, item, prompt_tokens):
        """Counts a request in: True when it is admitted at once, else item
        waits in admission."""
        counters = self.counters
        counters['requests_total'] += 1
        counters['prompt_tokens_total'] += prompt_tokens
        self.peak_inflight = max(self.peak_inflight, self.inflight + 1)
        return self.admission.take(item)

    def start_prefill(self, chain, prompt_tokens):
        """A request that has the lane looks its prompt up in the cache:
        (cached tokens, seconds of prefill)."""
        cached = model.cached_tokens(self.cache, chain, prompt_tokens)
        counters = self.counters
        counters['queried_tokens_total'] += prompt_tokens
        counters['cached_tokens_total'] += cached
        counters['cache_hits_total' if cached > 0
                 else 'cache_misses_total'] += 1
        return cached, self.params.prefill_seconds(prompt_tokens - cached)

    def end_prefill(self, chain):
        """Prefill done: the prompt's blocks are the most recently used."""
        self.cache.insert(chain)

    def reset(self):
        """An empty cache and zero counters; requests in flight go on."""
        self.cache = model.PrefixCache(self.params.cache_blocks)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.peak_inflight = self.inflight

    def stats(self):
        """Every figure of METRICS, by name."""
        figures = dict(self.counters)
        figures.update(running=self.admission.in_use,
                       waiting=len(self.admission.waiting),
                       peak_inflight=self.peak_inflight,
                       cache_blocks=len(self.cache))
        return figures


def load_bound(total_inflight, replicas, factor=DEFAULT_FACTOR,
               slack=DEFAULT_SLACK):
    """The most in-flight requests a replica may hold counting the one
    being placed: max(factor × share, share + slack), share being an equal
    part of all in-flight requests plus the new one (the module's bound)."""
    share = (total_inflight + 1) / replicas
    return max(factor * share, share + slack)


def slowed(params, slowdown):
    """params of a replica slowdown times slower: its prefill and decode
    take that many times as long (an older GPU, a smaller tensor-parallel
    size)."""
    if slowdown == 1:
        return params
    return replace(params,
                   prefill_ms_per_token=params.prefill_ms_per_token
                   * slowdown,
                   decode_ms_per_token=params.decode_ms_per_token
                   * slowdown)


class Fleet:
    """Replicas of one model, named replica-1, replica-2, ... unless
    given names, and the load a router sees.  slowdowns: one factor per
    replica (slowed()); params apply as they are to the others."""

    def __init__(self, params, replicas=None, names=None, slowdowns=()):
        names = names or ['replica-%d' % n
                          for n in range(1, replicas + 1)]
        slowdowns = list(slowdowns) + [1] * (len(names) - len(slowdowns))
        self.params = params
        self.replicas = [Replica(slowed(params, s), name)
                         for name, s in zip(names, slowdowns)]

    def inflight(self, r):
        return self.replicas[r].inflight

    def total_inflight(self):
        return sum(rep.inflight for rep in self.replicas)

    def under_bound(self, r, factor, slack):
        """Whether replica r may take one more request."""
        bound = load_bound(self.total_inflight(), len(self.replicas),
                           factor, slack)
        return self.replicas[r].inflight + 1 <= bound

    def least_loaded(self, candidates):
        """The candidate with the fewest in-flight requests; ties go to
        the one that received fewer so far, then to the lowest index."""
        replicas = self.replicas
        return min(candidates, key=lambda r: (
            replicas[r].inflight, replicas[r].counters['requests_total'], r))
