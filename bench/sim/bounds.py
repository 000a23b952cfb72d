#!/usr/bin/python3
"""Offline figures for a trace on the modelled fleet: what an unbounded
cache could reuse, what a router that knows every replica's cache could
reach while keeping load balanced, and what simple policies get, all with
the replica model the mock backend implements (model.py), so that the
numbers are directly comparable with a replay against the mock.

    /usr/bin/python3 bench/sim/bounds.py [--trace PATH] [--limit N] \\
        [--replicas 4] [--factor 1.25] [--cache-tokens 262144] ...

prints one JSON document.  Figures are in trace time: TTFTs are trace
seconds, as the replay tool reports them after scaling by its speed.

Prompts.  A trace record becomes the chat request that trace.chat_body()
sends; the mock hashes role + "\\n" + content + "\\n" of it
(trace.chat_prompt_text), so that is the text whose model.block_chain we
compute, and prompt tokens are model.prompt_tokens of it (input_length + 2).

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
import sys
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ''):       # run as a file: bench/sim/bounds.py
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.sim import model, trace  # noqa: E402
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
    """One trace record as the simulator needs it."""
    index: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    session: str
    packed: tuple           # of packed chain parts

    def chain(self):
        return unpack_chain(self.packed)


def prepare_requests(records, start=0, builder=None):
    """SimRequests for records numbered from `start`, with their chains
    computed once (packed, so that the full trace fits in memory)."""
    builder = builder or ChainBuilder()
    arrivals = trace.arrival_seconds(records)
    requests = []
    for i, (record, arrival) in enumerate(zip(records, arrivals)):
        text_chars = record['input_length'] * model.CHARS_PER_TOKEN \
            + len(builder.head) + len(builder.tail)
        tokens = -(-text_chars // model.CHARS_PER_TOKEN)   # prompt_tokens()
        requests.append(SimRequest(
            start + i, arrival, tokens, record['output_length'],
            trace.session_id(record, start + i), builder.packed(record)))
    return requests


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
    __slots__ = ('req', 'chain', 'replica', 'cached_tokens', 'ttft')

    def __init__(self, req, chain, replica):
        self.req = req
        self.chain = chain
        self.replica = replica
        self.cached_tokens = 0
        self.ttft = None


# Event kinds, in the order they are handled at equal times.
_PREFILL_END, _FINISH = 0, 1


class Simulation:
    """A discrete-event simulation of a fleet (fleet.Fleet: its rules, see
    the module docstring) fed by a routing policy."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.events = []
        self.seq = 0

    def run(self, requests, policy):
        """Routes and serves requests (in arrival order, ties in list
        order); returns the finished Jobs in that order."""
        jobs = []
        for req in sorted(requests, key=lambda r: r.arrival):
            self._advance(req.arrival)
            chain = req.chain()
            r = policy.choose(req, chain, self.fleet)
            job = Job(req, chain, r)
            jobs.append(job)
            self._arrive(job, req.arrival)
        self._advance(float('inf'))
        for job in jobs:
            job.chain = None        # only needed while in flight
        return jobs

    def _push(self, time, kind, job):
        self.seq += 1
        heapq.heappush(self.events, (time, kind, self.seq, job))

    def _advance(self, until):
        while self.events and self.events[0][0] <= until:
            time, kind, _, job = heapq.heappop(self.events)
            if kind == _PREFILL_END:
                self._prefill_end(job, time)
            else:
                self._finish(job, time)

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
        self._push(now + rep.params.decode_seconds(job.req.output_tokens),
                   _FINISH, job)
        following = rep.lane.release()
        if following is not None:
            self._start_prefill(rep, following, now)

    def _finish(self, job, now):
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
    """Consistent hashing of the session id.  Unbounded: the key's replica
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
        walk = self.ring.walk(req.session)
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
    to measure."""
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
        pin = self.pins.get(req.session)
        if pin is None:
            pin = next((r for r in self.ring.walk(req.session) if under(r)),
                       None)
            if pin is None:
                pin = fleet.least_loaded(self.candidates)
            self.pins[req.session] = pin
            return pin
        if under(pin):
            return pin
        self.spills += 1
        peer = self.spill_peer.get(req.session)
        if peer is None or not under(peer):
            peer = next((r for r in self.ring.walk(req.session)
                         if r != pin and under(r)), None)
            if peer is None:
                return fleet.least_loaded(self.candidates)
            self.spill_peer[req.session] = peer
        if self.follow:
            self.spill_peer[req.session] = pin
            self.pins[req.session] = peer
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


POLICIES = ('oracle', 'round_robin', 'least_loaded', 'chash_session',
            'chash_session_bounded', 'affinity', 'affinity_follow')


def make_policy(name, replicas, factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK,
                points=RING_POINTS):
    """A fresh policy object (policies keep state, such as pins)."""
    if name == 'oracle':
        return PrefixOracle(replicas, factor, slack)
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
    raise ValueError('unknown policy %r' % name)


# --- running and summarizing ----------------------------------------------

def simulate(requests, policy_name, replicas=4, params=None,
             factor=DEFAULT_FACTOR, slack=DEFAULT_SLACK, points=RING_POINTS):
    """Serves requests on a fresh fleet with a fresh policy; returns
    (summary dict, jobs).  Deterministic: same inputs, same result."""
    params = params or model.ReplicaParams()
    policy = make_policy(policy_name, replicas, factor, slack, points)
    fleet = Fleet(params, replicas)
    jobs = Simulation(fleet).run(requests, policy)
    summary = summarize(jobs, fleet)
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
    }


def _round(value, digits=6):
    """Seconds to the microsecond: the simulator's sums carry float noise."""
    return None if value is None else round(value, digits)


# --- command line ----------------------------------------------------------

def parse_args(argv=None):
    defaults = model.ReplicaParams()
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    trace.add_trace_arguments(p, 'use')
    p.add_argument('--replicas', type=int, default=4)
    p.add_argument('--factor', type=float, default=DEFAULT_FACTOR,
                   help='load bound factor (default %(default)s)')
    p.add_argument('--slack', type=float, default=DEFAULT_SLACK,
                   help='load bound slack in requests (default %(default)s)')
    p.add_argument('--ring-points', type=int, default=RING_POINTS,
                   help='consistent-hash points per replica')
    p.add_argument('--max-running', type=int, default=defaults.max_running)
    p.add_argument('--prefill-ms-per-token', type=float,
                   default=defaults.prefill_ms_per_token)
    p.add_argument('--decode-ms-per-token', type=float,
                   default=defaults.decode_ms_per_token)
    p.add_argument('--cache-tokens', type=int, default=defaults.cache_tokens,
                   help='prefix cache capacity per replica, in tokens')
    p.add_argument('--policies', default=','.join(POLICIES),
                   help='comma-separated, from: %s' % ', '.join(
                       POLICIES))
    p.add_argument('--output', help='write the JSON here instead of stdout')
    args = p.parse_args(argv)
    unknown = set(args.policies.split(',')) - set(POLICIES)
    if unknown:
        p.error('unknown policies: %s' % ', '.join(sorted(unknown)))
    return args


def replica_params(args):
    """Replica parameters in trace time (time_scale 1)."""
    return model.ReplicaParams(
        max_running=args.max_running,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        cache_tokens=args.cache_tokens,
        time_scale=1.0)


def timed(runtimes, name, fn, *a, **kw):
    """fn(*a, **kw), recording its wall time in runtimes[name]."""
    t0 = time.perf_counter()
    result = fn(*a, **kw)
    runtimes[name] = round(time.perf_counter() - t0, 3)
    return result


def compute(args):
    """The result document."""
    runtimes = {}
    records = timed(runtimes, 'load', trace.load_trace, args.trace,
                    args.limit, args.start)
    requests = timed(runtimes, 'chains', prepare_requests, records,
                     args.start)
    params = replica_params(args)
    doc = {
        'trace': Path(args.trace).name,
        'records': len(records),
        'start': args.start,
        'replicas': args.replicas,
        'factor': args.factor,
        'slack': args.slack,
        'params': asdict(params),
        'infinite_cache': timed(runtimes, 'infinite_cache',
                                infinite_cache, requests),
    }
    doc['infinite_cache_hit_ratio'] = doc['infinite_cache']['hit_ratio']
    doc['policies'] = {}
    for name in args.policies.split(','):
        summary, _ = timed(runtimes, name, simulate, requests, name,
                           args.replicas, params, args.factor, args.slack,
                           args.ring_points)
        if name == 'oracle':
            doc['oracle'] = summary
        else:
            doc['policies'][name] = summary
    doc['runtime_s'] = runtimes
    return doc


def main(argv=None):
    args = parse_args(argv)
    doc = compute(args)
    text = json.dumps(doc, indent=2)
    if args.output:
        Path(args.output).write_text(text + '\n')
    else:
        sys.stdout.write(text + '\n')


if __name__ == '__main__':
    main()
