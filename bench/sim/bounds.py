#!/usr/bin/python3
"""Offline figures for a workload on the modelled fleet: what an unbounded
cache could reuse, what a router that knows every replica's cache could
reach while keeping load balanced, and what simple policies get, all with
the replica model the mock backend implements (model.py), so that the
numbers are directly comparable with a replay against the mock.

    /usr/bin/python3 bench/sim/bounds.py [--trace PATH] [--limit N] \\
        [--replicas 4] [--factor 1.25] [--cache-tokens 262144] ...
    /usr/bin/python3 bench/sim/bounds.py --workload chat --seed 2 \\
        --size quick --profile tight --sessions both
    /usr/bin/python3 bench/sim/bounds.py --workload conversation \\
        --size full --profile tight --sessions off --store-latency 0.01 \\
        --policies module_x1_metrics,module_x4_shared

prints one JSON document (or writes it to --output), which begins with
the stamp of bench/stamp.py: the command line, commit, module version and
date of the run.  Workloads are workloads.py's (the Mooncake
conversation trace by default, whole unless --limit, --start or --size
cut a slice); --profile takes a fleet profile of profiles.py (replicas,
running slots, cache size, arrival rate multiplier), whose values the
other options override.  Figures are in profile time: arrivals at the
profile's rate, TTFTs in the seconds of the model, as the replay tool
reports them after scaling by its speed.  With --sessions both, policies
that read the session id are simulated with and without it (by_sessions);
moves are counted by trace.session_moves.

Prompts.  A trace record becomes the chat request that trace.chat_body()
sends; the mock hashes role + "\\n" + content + "\\n" of it
(trace.chat_prompt_text), so that is the text whose model.block_chain we
compute, and prompt tokens are model.prompt_tokens of it (input_length + 2).
A generated request's text is the mock's too (chat_prompt_pieces: its
tools, then its messages); its chain is memoized per piece (PieceChains),
so a turn hashes only the messages its session's previous turn lacked.

Speed.  The full conversation trace has ~9M model blocks of 16 tokens
(64 characters); building 48 KB prompts and hashing them from scratch for
every record is far too slow.  Block chains are therefore memoized per
trace block: a trace block is 2048 characters, exactly 32 model blocks,
so the 2048-character segment j of the mock's prompt text always covers
model blocks 32j..32j+31.  Because of the 5-character "user\\n" head the
segment holds the last 5 characters of trace block j-1 and the first 2043
of trace block j, so its 32 hashes are a function of (hash before it, id
of block j-1, id of block j) and are computed once per distinct key.  Only
the end of each prompt (the partial last trace block and the closing
"\\n") is hashed per record.  ChainBuilder.chain(r) is checked against
model.block_chain by the tests.  On the full trace this takes about 10 s
and each simulated policy about 6-10 s on one core; the chains are kept
packed (one bytes object per segment) and unpacked only while a request is
in flight, which keeps memory under 1 GB.

The fleet simulator is a discrete-event simulation of the rules of
model.py and fleet.py, which the mock follows in real time, a pure
function of its inputs:
- a replica admits at most max_running requests, the others wait FIFO;
- admitted requests take the replica's single prefill lane in FIFO order;
  when a request gets the lane, its cached prefix is looked up in the
  replica's PrefixCache, and prefill takes prefill_seconds(uncached);
- when prefill ends the first token is out (TTFT = end - arrival), the
  prompt's chain is inserted into the cache, and decoding takes
  decode_seconds(output_tokens) concurrently with the other requests;
- the request then leaves and frees its running slot.
Events at equal times are handled prefill ends first, then finishes, then
arrivals (in trace order), so a request arriving exactly when another one
finishes sees the freed slot.  Times are in trace seconds (time_scale 1).
"""

import argparse
import hashlib
import heapq
import json
import re
import sys
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ''):       # run as a file: bench/sim/bounds.py
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench import stamp  # noqa: E402
from bench.sim import model, profiles, trace, workloads  # noqa: E402
from bench.sim.fleet import (DEFAULT_FACTOR, DEFAULT_SLACK,  # noqa: E402
                             Fleet)

# The digest size model.block_chain uses; the tests compare chains.
DIGEST_SIZE = 12
SEGMENT_BLOCKS = trace.TRACE_BLOCK_CHARS // model.BLOCK_CHARS       # 32
assert SEGMENT_BLOCKS * model.BLOCK_CHARS == trace.TRACE_BLOCK_CHARS

RING_POINTS = 160


# --- block chains -------------------------------------------------------

def chain_continue(prev, data):
    """Chained hashes of the full blocks of data (bytes), continuing a
    chain whose last hash is prev (b'' for a chain's start); packed into
    one bytes object of DIGEST_SIZE-byte hashes.  Same hashing as
    model.block_chain: chain_continue(b'', t.encode()) packs block_chain(t).
    """
    blake2b, size = hashlib.blake2b, model.BLOCK_CHARS     # hot loop
    out = []
    append = out.append
    for start in range(0, len(data) - size + 1, size):
        prev = blake2b(prev + data[start:start + size],
                       digest_size=DIGEST_SIZE).digest()
        append(prev)
    return b''.join(out)


def unpack_chain(packed):
    """The list of block hashes held in a tuple of packed chain parts."""
    return [part[i:i + DIGEST_SIZE]
            for part in packed for i in range(0, len(part), DIGEST_SIZE)]


def _prompt_slice(record, start, end):
    """prompt_text(record)[start:end], built from only the trace blocks it
    covers."""
    end = min(end, trace.prompt_chars(record))
    if start >= end:
        return ''
    step = trace.TRACE_BLOCK_CHARS
    first, last = start // step, (end - 1) // step
    ids = record['hash_ids']
    text = ''.join(trace.block_text(ids[b]) for b in range(first, last + 1))
    return text[start - first * step:end - first * step]


class ChainBuilder:
    """Model block chains of the mock's prompt texts for trace records,
    memoized per trace block (see the module docstring)."""

    def __init__(self, role=trace.PROMPT_ROLE):
        probe = trace.chat_prompt_text('', role)
        self.head = probe[:len(role) + 1]          # role + "\n"
        self.tail = probe[len(role) + 1:]          # "\n"
        if len(self.head) >= trace.TRACE_BLOCK_CHARS:
            raise ValueError('role too long for segment memoization')
        self.segments = {}

    def packed(self, record):
        """The record's chain as a tuple of packed parts (memoized
        segments, then the record's own end)."""
        size = trace.prompt_chars(record)
        head = len(self.head)
        step = trace.TRACE_BLOCK_CHARS
        parts = []
        prev = b''
        j = 0
        while step * (j + 1) <= head + size:
            segment = self._segment(record, j, prev)
            parts.append(segment)
            prev = segment[-DIGEST_SIZE:]
            j += 1
        rest = (self.head if j == 0 else '') \
            + _prompt_slice(record, max(0, step * j - head), size) + self.tail
        parts.append(chain_continue(prev, rest.encode('utf-8')))
        return tuple(parts)

    def chain(self, record):
        """The record's chain as model.block_chain would return it."""
        return unpack_chain(self.packed(record))

    def _segment(self, record, j, prev):
        """The 32 packed hashes of segment j, from the memo when known."""
        ids = record['hash_ids']
        key = (prev, ids[j - 1] if j else None, ids[j])
        segment = self.segments.get(key)
        if segment is None:
            head = len(self.head)
            step = trace.TRACE_BLOCK_CHARS
            text = (self.head if j == 0 else '') + _prompt_slice(
                record, max(0, step * j - head), step * (j + 1) - head)
            segment = chain_continue(prev, text.encode('utf-8'))
            self.segments[key] = segment
        return segment


@dataclass(slots=True)
class SimRequest:
    """One request as the simulator needs it."""
    index: int
    arrival: float          # profile seconds
    prompt_tokens: int
    output_tokens: int
    session: str            # the workload's session (moves are counted by it)
    packed: tuple           # of packed chain parts
    key: str = None         # the session id sent (X-Session-ID), or None
    source: object = None   # the workloads.Request, for its body
    memo: dict = None       # what policies derive from it once (levels)

    def chain(self):
        return unpack_chain(self.packed)


def prepare_requests(records, start=0, builder=None):
    """SimRequests for records numbered from `start`, with their chains
    computed once (packed, so that the full trace fits in memory)."""
    builder = builder or ChainBuilder()
    arrivals = trace.arrival_seconds(records)
    requests = []
    for i, (record, arrival) in enumerate(zip(records, arrivals)):
        session = trace.session_id(record, start + i)
        source = workloads.Request(start + i, arrival, session,
                                   record['output_length'], record=record)
        requests.append(SimRequest(
            start + i, arrival, _record_tokens(record, builder),
            record['output_length'], session, builder.packed(record),
            session, source, {}))
    return requests


def _record_tokens(record, builder):
    """model.prompt_tokens() of the mock's prompt text of a record."""
    text_chars = record['input_length'] * model.CHARS_PER_TOKEN \
        + len(builder.head) + len(builder.tail)
    return -(-text_chars // model.CHARS_PER_TOKEN)


class PieceChains:
    """Model block chains of prompt texts given in pieces (one per tool and
    message, mock_backend.chat_prompt_pieces), memoized per piece: the
    hashing state after a prefix of pieces (the chain's parts, its last
    hash, the bytes of the partial block after it) is computed once, so a
    conversation's turn hashes only the messages its previous turn did not
    have.  packed(pieces) is checked against model.block_chain by the
    tests."""

    def __init__(self):
        # state: (parts, last hash, pending bytes); 0 is the empty text
        self.states = [((), b'', b'')]
        self.next = {}

    def packed(self, pieces):
        """The chain of ''.join(pieces) as a tuple of packed parts."""
        state = 0
        for piece in pieces:
            key = (state, piece)
            following = self.next.get(key)
            if following is None:
                following = self._extend(state, piece)
                self.next[key] = following
            state = following
        return self.states[state][0]

    def _extend(self, state, piece):
        parts, prev, pending = self.states[state]
        data = pending + piece.encode('utf-8')
        full = len(data) - len(data) % model.BLOCK_CHARS
        if full:
            part = chain_continue(prev, data[:full])
            parts = parts + (part,)
            prev = part[-DIGEST_SIZE:]
        self.states.append((parts, prev, data[full:]))
        return len(self.states) - 1


def prepare_workload(workload, rate_multiplier=1.0, sessions=True,
                     builder=None, pieces=None):
    """SimRequests for the requests of a workloads.Workload, arriving at
    rate_multiplier times its rate; with sessions, each carries its session
    id as the key a session-affinity router reads."""
    builder = builder or ChainBuilder()
    pieces = pieces or PieceChains()
    requests = []
    for req in workload.requests:
        if req.record is not None:
            packed = builder.packed(req.record)
            tokens = _record_tokens(req.record, builder)
        else:
            texts = req.prompt_pieces()
            packed = pieces.packed(texts)
            # model.prompt_tokens() of the text the pieces make
            tokens = max(1, -(-sum(map(len, texts)) // model.CHARS_PER_TOKEN))
        requests.append(SimRequest(
            req.index, req.arrival / rate_multiplier, tokens,
            req.output_tokens, req.session, packed,
            req.session if sessions else None, req, {}))
    return requests


def with_sessions(requests, sessions):
    """The same requests with their session id sent or not (the chains are
    shared, the policies' memos too)."""
    return [SimRequest(r.index, r.arrival, r.prompt_tokens, r.output_tokens,
                       r.session, r.packed, r.session if sessions else None,
                       r.source, r.memo)
            for r in requests]


def distinct_blocks(requests):
    """How many distinct model blocks the prompts of requests hold (the
    tight profile sizes its caches by it).  Parts shared between requests
    (memoized segments and messages) are read once."""
    seen_parts = set()
    blocks = set()
    for req in requests:
        for part in req.packed:
            if id(part) in seen_parts:
                continue
            seen_parts.add(id(part))
            blocks.update(part[i:i + DIGEST_SIZE]
                          for i in range(0, len(part), DIGEST_SIZE))
    return len(blocks)


# --- the unbounded shared cache ----------------------------------------

def infinite_cache(requests):
    """Token-weighted prefix reuse with one shared cache of unbounded
    capacity: each request, in arrival order, is served its longest cached
    prefix of full blocks (as PrefixCache.cached_prefix) and then adds its
    blocks.  A set suffices because nothing is ever evicted."""
    seen = set()
    prompt = cached = 0
    for req in sorted(requests, key=lambda r: r.arrival):
        chain = req.chain()
        n = 0
        for h in chain:
            if h not in seen:
                break
            n += 1
        seen.update(chain[n:])
        prompt += req.prompt_tokens
        cached += min(req.prompt_tokens, n * model.BLOCK_TOKENS)
    return {'prompt_tokens': prompt, 'cached_tokens': cached,
            'hit_ratio': cached / prompt if prompt else None}


# --- hashing ---------------------------------------------------------------

def hash64(text):
    """A stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode('utf-8'),
                                          digest_size=8).digest(), 'big')


class HashRing:
    """A consistent-hash ring with `points` positions per replica."""

    def __init__(self, replicas, points=RING_POINTS):
        ring = sorted((hash64('replica-%d#%d' % (r, k)), r)
                      for r in range(replicas) for k in range(points))
        self.positions = [p for p, _ in ring]
        self.owners = [r for _, r in ring]
        self.replicas = replicas

    def walk(self, key):
        """Distinct replicas clockwise from the key's position."""
        start = bisect_right(self.positions, hash64(key))
        seen = set()
        for i in range(len(self.owners)):
            owner = self.owners[(start + i) % len(self.owners)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.replicas:
                    return


# --- the simulation ---------------------------------------------------------

class Job:
    """A request in the simulated fleet and what happened to it."""
    __slots__ = ('req', 'chain', 'replica', 'cached_tokens', 'ttft',
                 'token', 'could_stay')

    def __init__(self, req, chain, replica, token=None, could_stay=None):
        self.req = req
        self.chain = chain
        self.replica = replica
        self.cached_tokens = 0
        self.ttft = None
        self.token = token      # the policy's, given back when it ends
        # whether the replica of the session's request before could have
        # taken this one (under the load bound as it arrived), or None
        self.could_stay = could_stay


# Event kinds, in the order they are handled at equal times.
_PREFILL_END, _FINISH, _ARRIVE = 0, 1, 2


class Simulation:
    """A discrete-event simulation of a fleet (fleet.Fleet: its rules, see
    the module docstring) fed by a routing policy.  It also times how long
    a replica sat idle while another had requests waiting for a running
    slot, up to the last arrival: idle_queued (seconds in all) and
    idle_queued_max (the longest such stretch).  Once nothing arrives
    any more no routing can fill the idle replica, so the drain after
    it is not counted.  The requests routed meanwhile are idle_routed,
    those of them sent where they wait for a running slot
    idle_routed_to_queue: what routing could have sent to the idle
    replica instead."""

    def __init__(self, fleet, factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK,
                 transit=0.0):
        self.fleet = fleet
        self.factor, self.slack = factor, slack     # the load bound's
        # from routing to the replica counting the request in: an engine
        # reads and tokenizes a prompt before its scheduler counts it
        self.transit = transit
        self.events = []
        self.seq = 0
        self.policy = None
        self.idle_queued = 0.0
        self.idle_queued_max = 0.0
        self._idle_since = None
        self._arriving = True
        self.idle_routed = 0
        self.idle_routed_to_queue = 0

    def run(self, requests, policy):
        """Routes and serves requests (in arrival order, ties in list
        order); returns the finished Jobs in that order.  A policy's
        choose() returns a replica, or (replica, token) when it wants
        release(token) called as the request ends (the module's in-flight
        counters), and replied(token, cached tokens, prompt tokens) before
        if it has one (the usage the reply gives)."""
        self.policy = policy
        jobs = []
        last = {}           # session -> the replica of its last request
        for req in sorted(requests, key=lambda r: r.arrival):
            self._advance(req.arrival)
            chain = req.chain()
            previous = last.get(req.session)
            could_stay = None if previous is None else \
                self.fleet.under_bound(previous, self.factor, self.slack)
            r = policy.choose(req, chain, self.fleet)
            token = None
            if isinstance(r, tuple):
                r, token = r
            last[req.session] = r
            if self._idle_since is not None:
                rep = self.fleet.replicas[r]
                self.idle_routed += 1
                if rep.inflight >= rep.admission.capacity:
                    self.idle_routed_to_queue += 1
            job = Job(req, chain, r, token, could_stay)
            jobs.append(job)
            if self.transit:
                self._push(req.arrival + self.transit, _ARRIVE, job)
            else:
                self._arrive(job, req.arrival)
                self._observe(req.arrival)
        if jobs:
            self._idle_until(jobs[-1].req.arrival)
        self._arriving = False
        # the last requests end; a policy's timers have nothing left to do
        self._advance(float('inf'), timers=False)
        for job in jobs:
            job.chain = None        # only needed while in flight
        return jobs

    def _push(self, time, kind, job):
        self.seq += 1
        heapq.heappush(self.events, (time, kind, self.seq, job))

    def _advance(self, until, timers=True):
        """Handles the events up to until, and the policy's timers (its
        next_timer() and timer(now, fleet), if it has them) at their
        times, before the events of the same time."""
        next_timer = getattr(self.policy, 'next_timer', None) \
            if timers else None
        events = self.events
        while True:
            event = events[0][0] if events else float('inf')
            timer = next_timer() if next_timer else float('inf')
            first = min(event, timer)
            if first > until or first == float('inf'):
                return
            if timer <= event:
                self.policy.timer(timer, self.fleet)
                continue
            time, kind, _, job = heapq.heappop(events)
            if kind == _PREFILL_END:
                self._prefill_end(job, time)
            elif kind == _ARRIVE:
                self._arrive(job, time)
            else:
                self._finish(job, time)
            self._observe(time)

    def _observe(self, now):
        """After the fleet changed at now: whether a replica is idle while
        another has requests waiting for a running slot, timed."""
        if not self._arriving:
            return
        replicas = self.fleet.replicas
        idle = any(rep.inflight == 0 for rep in replicas) and \
            any(rep.admission.waiting for rep in replicas)
        if idle and self._idle_since is None:
            self._idle_since = now
        elif not idle:
            self._idle_until(now)

    def _idle_until(self, now):
        """Ends the stretch of idling under way, if any, at now."""
        if self._idle_since is not None:
            stretch = now - self._idle_since
            self.idle_queued += stretch
            self.idle_queued_max = max(self.idle_queued_max, stretch)
            self._idle_since = None

    def _arrive(self, job, now):
        rep = self.fleet.replicas[job.replica]
        if rep.arrive(job, job.req.prompt_tokens):
            self._admitted(rep, job, now)

    def _admitted(self, rep, job, now):
        if rep.lane.take(job):
            self._start_prefill(rep, job, now)

    def _start_prefill(self, rep, job, now):
        job.cached_tokens, seconds = rep.start_prefill(job.chain,
                                                       job.req.prompt_tokens)
        self._push(now + seconds, _PREFILL_END, job)

    def _prefill_end(self, job, now):
        rep = self.fleet.replicas[job.replica]
        rep.end_prefill(job.chain)
        job.ttft = now - job.req.arrival
        # The first token, for a policy that counts prefills ahead.
        started = getattr(self.policy, 'started', None)
        if started is not None and job.token is not None:
            started(job.token)
        self._push(now + rep.params.decode_seconds(job.req.output_tokens),
                   _FINISH, job)
        following = rep.lane.release()
        if following is not None:
            self._start_prefill(rep, following, now)

    def _finish(self, job, now):
        if job.token is not None:
            # The time, for a policy that keeps one (core_policy.Instances)
            at = getattr(self.policy, 'at', None)
            if at is not None:
                at(now)
            # The reply's usage, for a policy that learns from it.
            # Its times too: the first token after job.ttft, the last now,
            # streamed (the time to the first byte).
            replied = getattr(self.policy, 'replied', None)
            if replied is not None:
                replied(job.token, job.cached_tokens, job.req.prompt_tokens,
                        job.ttft, now - job.req.arrival,
                        job.req.output_tokens)
            self.policy.release(job.token)
        rep = self.fleet.replicas[job.replica]
        admitted = rep.admission.release()
        if admitted is not None:
            self._admitted(rep, admitted, now)


# --- routing policies ----------------------------------------------------

class RoundRobin:
    name = 'round_robin'

    def __init__(self, replicas):
        self.replicas = replicas
        self.count = 0

    def choose(self, req, chain, fleet):
        r = self.count % self.replicas
        self.count += 1
        return r

    def stats(self):
        return {}


class LeastLoaded:
    name = 'least_loaded'

    def __init__(self, replicas):
        self.candidates = range(replicas)

    def choose(self, req, chain, fleet):
        return fleet.least_loaded(self.candidates)

    def stats(self):
        return {}


class ConsistentHash:
    """Consistent hashing of the session id (an empty key without one, as
    nginx hashes an absent header).  Unbounded: the key's replica
    on the ring.  Bounded (consistent hashing with bounded loads): the
    first replica clockwise that is under the load bound, else the least
    loaded."""

    def __init__(self, replicas, bounded, factor=DEFAULT_FACTOR,
                 slack=DEFAULT_SLACK, points=RING_POINTS):
        self.name = 'chash_session_bounded' if bounded else 'chash_session'
        self.ring = HashRing(replicas, points)
        self.bounded = bounded
        self.factor, self.slack = factor, slack
        self.candidates = range(replicas)
        self.moved = 0

    def choose(self, req, chain, fleet):
        walk = self.ring.walk(req.key or '')
        home = next(walk)
        if not self.bounded or fleet.under_bound(home, self.factor,
                                                 self.slack):
            return home
        self.moved += 1
        for r in walk:
            if fleet.under_bound(r, self.factor, self.slack):
                return r
        return fleet.least_loaded(self.candidates)

    def stats(self):
        return {'moved_by_bound': self.moved} if self.bounded else {}


class SessionAffinity:
    """An approximation of the nginx module's routing (its README): a new
    session is pinned to the first replica on the ring under the load
    bound; a pinned session goes to its pin while that is under the bound,
    else spills to the replica that took its last spill if that is under
    the bound, else to the next one on the ring under the bound (the pin is
    kept); with every replica over the bound, the least loaded serves.
    With follow=True the pin moves to the replica that took the spill (it
    now holds the whole conversation) and the old pin becomes the preferred
    replica for the next spill: the alternative the module's design asks
    to measure.  A request without a session id goes to the least loaded
    replica."""
    name = 'affinity'

    def __init__(self, replicas, factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK,
                 points=RING_POINTS, follow=False):
        self.follow = follow
        self.ring = HashRing(replicas, points)
        self.factor, self.slack = factor, slack
        self.candidates = range(replicas)
        self.pins = {}
        self.spill_peer = {}
        self.spills = 0

    def choose(self, req, chain, fleet):
        def under(r):
            return fleet.under_bound(r, self.factor, self.slack)
        key = req.key
        if key is None:
            return fleet.least_loaded(self.candidates)
        pin = self.pins.get(key)
        if pin is None:
            pin = next((r for r in self.ring.walk(key) if under(r)), None)
            if pin is None:
                pin = fleet.least_loaded(self.candidates)
            self.pins[key] = pin
            return pin
        if under(pin):
            return pin
        self.spills += 1
        peer = self.spill_peer.get(key)
        if peer is None or not under(peer):
            peer = next((r for r in self.ring.walk(key)
                         if r != pin and under(r)), None)
            if peer is None:
                return fleet.least_loaded(self.candidates)
            self.spill_peer[key] = peer
        if self.follow:
            self.spill_peer[key] = pin
            self.pins[key] = peer
        return peer

    def stats(self):
        return {'spills': self.spills, 'sessions': len(self.pins)}


class PrefixOracle:
    """The bound to beat: a router that sees every replica's cache.  Among
    the replicas under the load bound it takes the one with the longest
    cached prefix of the request; ties, and no match at all, go to the
    least loaded of them.  The least loaded replica is always under the
    bound, so there is always a candidate."""
    name = 'oracle'

    def __init__(self, replicas, factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK):
        self.replicas = replicas
        self.factor, self.slack = factor, slack
        self.diverted = 0

    def choose(self, req, chain, fleet):
        prefix = [fleet.replicas[r].cache.cached_prefix(chain)
                  for r in range(self.replicas)]
        eligible = [r for r in range(self.replicas)
                    if fleet.under_bound(r, self.factor, self.slack)]
        best = max(prefix[r] for r in eligible)
        if best < max(prefix):
            self.diverted += 1
        if best == 0:
            return fleet.least_loaded(eligible)
        return fleet.least_loaded([r for r in eligible if prefix[r] == best])

    def stats(self):
        return {'diverted_by_bound': self.diverted}


class SoonestOracle:
    """A router that sees every replica's cache, queue and speed, and
    sends each request where its first token would come soonest: the wait
    for a running slot (the requests ahead beyond the slots, each freeing
    one in an average reply's decode over the slots), the wait for the
    prefill lane, and the prefill of what the replica does not hold.  No
    load bound.  The average reply is learned from the replies so far."""
    name = 'soonest_oracle'

    def __init__(self, replicas):
        self.replicas = replicas
        self.output_mean = 200.0

    def first_token(self, rep, chain, req):
        p = rep.params
        cached = model.cached_tokens(rep.cache, chain, req.prompt_tokens)
        slots = rep.admission.capacity
        ahead = rep.inflight + 1 - slots
        wait = max(0, ahead) * p.decode_seconds(self.output_mean) / slots
        wait += (rep.lane.in_use + len(rep.lane.waiting)) \
            * p.prefill_seconds(req.prompt_tokens) / 2
        return wait + p.prefill_seconds(req.prompt_tokens - cached)

    def choose(self, req, chain, fleet):
        self.output_mean += (req.output_tokens - self.output_mean) / 100
        reps = fleet.replicas
        return min(range(self.replicas), key=lambda r: (
            self.first_token(reps[r], chain, req), reps[r].inflight, r))

    def stats(self):
        return {}


# The module_* policies run the module's C++ core (core_policy.py).
MODULE_POLICIES = ('module_session', 'module_prefix', 'module_session_prefix',
                   'module_prefix_cache', 'module_session_prefix_cache',
                   'module_prefix_turns0', 'module_session_prefix_turns0')
# Several instances of the module (core_policy.Instances): named only.
INSTANCE_POLICIES = ('module_x1_metrics', 'module_x2_shared',
                     'module_x4_shared', 'module_x4_metrics', 'module_x4',
                     'module_x4_shared_client')
POLICIES = ('oracle', 'soonest_oracle', 'round_robin', 'least_loaded',
            'chash_session', 'chash_session_bounded', 'affinity',
            'affinity_follow') + MODULE_POLICIES
KNOWN_POLICIES = POLICIES + INSTANCE_POLICIES
# Any number of instances sharing (core_policy.SHARED_NAME, without ctypes).
SHARED_NAME = re.compile(r'module_x([1-9][0-9]*)_shared(_client)?$')

# Policies whose routing reads the session id: simulated once per sessions
# mode.  The others are simulated once and reported for both.
KEYED_POLICIES = ('chash_session', 'chash_session_bounded', 'affinity',
                  'affinity_follow', 'module_session',
                  'module_session_prefix', 'module_session_prefix_cache',
                  'module_session_prefix_turns0') + INSTANCE_POLICIES
# Keyed policies that mean nothing without a session id (a hash of an
# absent header sends everything to one replica): not simulated then.
NEEDS_KEY = ('chash_session', 'chash_session_bounded', 'affinity',
             'affinity_follow')


def make_policy(name, replicas, factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK,
                points=RING_POINTS, store_latency=0.0, poll_interval=2.0,
                read_lag=0.0, poll_lag=0.0, without=()):
    """A fresh policy object (policies keep state, such as pins).
    store_latency, poll_interval, read_lag, poll_lag and without (what
    they do not share): the several instances' (module_x*, also
    module_xN_shared for any N)."""
    if name == 'oracle':
        return PrefixOracle(replicas, factor, slack)
    if name == 'soonest_oracle':
        return SoonestOracle(replicas)
    if name == 'round_robin':
        return RoundRobin(replicas)
    if name == 'least_loaded':
        return LeastLoaded(replicas)
    if name in ('chash_session', 'chash_session_bounded'):
        return ConsistentHash(replicas, name == 'chash_session_bounded',
                              factor, slack, points)
    if name in ('affinity', 'affinity_follow'):
        return SessionAffinity(replicas, factor, slack, points,
                               follow=name == 'affinity_follow')
    if name in MODULE_POLICIES + INSTANCE_POLICIES \
            or SHARED_NAME.match(name):
        from bench.sim import core_policy
        return core_policy.make(name, replicas, factor, slack,
                                latency=store_latency,
                                interval=poll_interval, read_lag=read_lag,
                                poll_lag=poll_lag, without=without)
    raise ValueError('unknown policy %r' % name)


# --- running and summarizing ----------------------------------------------

def simulate(requests, policy_name, replicas=4, params=None,
             factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK, points=RING_POINTS,
             transit=0.0, slowdowns=(), **instances):
    """Serves requests on a fresh fleet with a fresh policy; returns
    (summary dict, jobs).  Deterministic: same inputs, same result.
    transit: Simulation's; slowdowns: Fleet's; instances: make_policy()'s
    store_latency, poll_interval, read_lag, poll_lag."""
    params = params or model.ReplicaParams()
    policy = make_policy(policy_name, replicas, factor, slack, points,
                         **instances)
    fleet = Fleet(params, replicas, slowdowns=slowdowns)
    simulation = Simulation(fleet, factor, slack, transit)
    jobs = simulation.run(requests, policy)
    summary = summarize(jobs, fleet)
    summary['idle_while_queued_s'] = _round(simulation.idle_queued)
    summary['idle_while_queued_max_s'] = _round(simulation.idle_queued_max)
    summary['idle_while_queued_routed'] = simulation.idle_routed
    summary['idle_while_queued_routed_to_queue'] = \
        simulation.idle_routed_to_queue
    summary.update(policy.stats())
    return summary, jobs


def summarize(jobs, fleet):
    """Hit ratio, TTFT percentiles (trace seconds), and per-replica
    requests and peak in-flight of a simulation run."""
    prompt = sum(j.req.prompt_tokens for j in jobs)
    cached = sum(j.cached_tokens for j in jobs)
    ttfts = [j.ttft for j in jobs]
    counts = [rep.counters['requests_total'] for rep in fleet.replicas]
    peaks = [rep.peak_inflight for rep in fleet.replicas]
    ttft = {k: _round(v) for k, v in trace.percentiles(ttfts).items()}
    ttft['mean'] = _round(sum(ttfts) / len(ttfts)) if ttfts else None
    moves = trace.session_moves((j.req.session, j.req.arrival, j.replica,
                                 j.could_stay) for j in jobs)
    return {
        'requests': len(jobs),
        'prompt_tokens': prompt,
        'cached_tokens': cached,
        'hit_ratio': cached / prompt if prompt else None,
        'ttft_s': ttft,
        'replica_requests': counts,
        'replica_requests_max': max(counts),
        'replica_requests_mean': sum(counts) / len(counts),
        'peak_inflight': peaks,
        'peak_inflight_max': max(peaks),
        'peak_inflight_mean': sum(peaks) / len(peaks),
        'session_moves': moves,
        'moves_per_min': moves['moves_per_min'],
        'moved_session_share_per_min': moves['moved_session_share_per_min'],
        'unforced_moved_share_per_min':
            moves['unforced_moved_share_per_min'],
    }


def _round(value, digits=6):
    """Seconds to the microsecond: the simulator's sums carry float noise."""
    return None if value is None else round(value, digits)


# --- command line ----------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    trace.add_trace_arguments(p, 'use')
    workloads.add_workload_arguments(p)
    profiles.add_profile_arguments(p)
    p.add_argument('--sessions', choices=('on', 'off', 'both'),
                   default='on',
                   help='whether requests carry their session id '
                        '(default %(default)s)')
    p.add_argument('--factor', type=float, default=DEFAULT_FACTOR,
                   help='load bound factor (default %(default)s)')
    p.add_argument('--slack', type=float, default=DEFAULT_SLACK,
                   help='load bound slack in requests (default %(default)s)')
    p.add_argument('--ring-points', type=int, default=RING_POINTS,
                   help='consistent-hash points per replica')
    p.add_argument('--store-latency', type=float, default=0.0,
                   help='module_x*: seconds (profile time) before what one '
                        'instance publishes reaches the others (default '
                        '%(default)s)')
    p.add_argument('--read-lag', type=float, default=0.0,
                   help='module_x*: each instance reads each message up '
                        'to twice this many seconds (profile time) after '
                        'the store took it, at random, in the order it '
                        'took them (default %(default)s)')
    p.add_argument('--transit', type=float, default=0.0,
                   help='seconds (profile time) from routing a request to '
                        'its replica counting it in, as an engine reads '
                        'and tokenizes a prompt first (default '
                        '%(default)s)')
    p.add_argument('--poll-lag', type=float, default=0.0,
                   help='module_x*: seconds (profile time) from an '
                        'engine\'s report to its instance applying it '
                        '(default %(default)s)')
    p.add_argument('--poll-interval', type=float, default=2.0,
                   help='module_x*: seconds (profile time) between two '
                        'polls of the engines by one instance (default '
                        '%(default)s: interval=100ms replayed 20x faster)')
    p.add_argument('--policies', default=','.join(POLICIES),
                   help='comma-separated, from: %s (default: all but '
                        'module_x*)' % ', '.join(KNOWN_POLICIES))
    p.add_argument('--output', help='write the JSON here instead of stdout')
    args = p.parse_args(argv)
    unknown = set(args.policies.split(',')) - set(KNOWN_POLICIES)
    if unknown:
        p.error('unknown policies: %s' % ', '.join(sorted(unknown)))
    try:
        args.fleet_profile = profiles.from_args(args)
    except ValueError as e:
        p.error(str(e))
    return args


def timed(runtimes, name, fn, *a, **kw):
    """fn(*a, **kw), recording its wall time in runtimes[name]."""
    t0 = time.perf_counter()
    result = fn(*a, **kw)
    runtimes[name] = round(time.perf_counter() - t0, 3)
    return result


def offered_load(requests, profile, params):
    """What the workload asks of the fleet at the profile's rate, against
    what the fleet can do while the requests arrive: decode seconds over
    running-slot seconds (a lower bound of the slots' load: prefill and
    the wait for the lane hold a slot too), and prefill seconds with
    nothing cached over prefill-lane seconds.  A replica slowed down
    (profile.slowdowns()) does that part of a replica's work."""
    if len(requests) < 2:
        return {'slots': None, 'prefill_lanes_uncached': None}
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests)
    if span <= 0:
        return {'slots': None, 'prefill_lanes_uncached': None}
    decode = sum(params.decode_seconds(r.output_tokens) for r in requests)
    prefill = sum(params.prefill_seconds(r.prompt_tokens) for r in requests)
    replicas = sum(1.0 / s for s in profile.slowdowns())
    return {'slots': round(decode / (span * replicas
                                     * profile.max_running), 3),
            'prefill_lanes_uncached': round(prefill / (span * replicas), 3)}


def compute(args):
    """The result document."""
    runtimes = {}
    profile = args.fleet_profile
    workload = timed(runtimes, 'load', workloads.from_args, args)
    requests = timed(runtimes, 'chains', prepare_workload, workload,
                     profile.rate_multiplier)
    blocks = timed(runtimes, 'distinct_blocks', distinct_blocks, requests)
    params = profile.replica_params(blocks)
    described = profile.describe()
    described.update(distinct_blocks=blocks,
                     replica_cache_tokens=params.cache_tokens)
    doc = {
        'workload': workload.summary(),
        'trace': Path(args.trace).name
        if workload.name == 'conversation' else None,
        'records': len(requests),
        'start': workload.params.get('start', 0),
        'replicas': profile.replicas,
        'factor': args.factor,
        'slack': args.slack,
        'store_latency': args.store_latency,
        'poll_interval': args.poll_interval,
        'read_lag': args.read_lag,
        'poll_lag': args.poll_lag,
        'transit': args.transit,
        'profile': described,
        'params': asdict(params),
        'offered_load': offered_load(requests, profile, params),
        'infinite_cache': timed(runtimes, 'infinite_cache',
                                infinite_cache, requests),
    }
    doc['infinite_cache_hit_ratio'] = doc['infinite_cache']['hit_ratio']
    modes = ['on', 'off'] if args.sessions == 'both' else [args.sessions]
    names = args.policies.split(',')
    by_sessions = {}
    for mode in modes:
        sent = requests if mode == 'on' else with_sessions(requests, False)
        results = {}
        for name in names:
            if mode == 'off' and name in NEEDS_KEY:
                results[name] = None        # no key: not applicable
                continue
            if mode != modes[0] and name not in KEYED_POLICIES:
                results[name] = by_sessions[modes[0]][name]
                continue
            summary, jobs = timed(runtimes, '%s/%s' % (name, mode),
                                  simulate, sent, name, profile.replicas,
                                  params, args.factor, args.slack,
                                  args.ring_points,
                                  slowdowns=profile.slowdowns(),
                                  store_latency=args.store_latency,
                                  poll_interval=args.poll_interval,
                                  transit=args.transit,
                                  read_lag=args.read_lag,
                                  poll_lag=args.poll_lag)
            results[name] = summary
            if name == 'oracle':
                # Where the oracle sent each request, by its index in the
                # workload: a replay can send the same requests there
                # (bench.py's oracle_replay).
                doc['oracle_routes'] = {str(j.req.index): j.replica
                                        for j in jobs}
        by_sessions[mode] = results
    first = by_sessions[modes[0]]
    doc['sessions'] = modes
    if 'oracle' in first:
        doc['oracle'] = first['oracle']
    doc['policies'] = {k: v for k, v in first.items() if k != 'oracle'}
    doc['by_sessions'] = by_sessions
    doc['runtime_s'] = runtimes
    return doc


def main(argv=None):
    args = parse_args(argv)
    doc = {'stamp': stamp.stamp(program=__file__, argv=argv),
           **compute(args)}
    text = json.dumps(doc, indent=2)
    if args.output:
        Path(args.output).write_text(text + '\n')
    else:
        sys.stdout.write(text + '\n')


if __name__ == '__main__':
    main()
