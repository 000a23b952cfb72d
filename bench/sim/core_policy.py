"""The nginx module's routing as a policy of the offline fleet simulator
(bounds.py): the module's own C++ core (src/core), loaded with ctypes as
the shared library libaffinity_core.so and driven through its public C API
(src/core/include/affinity_core.h) only, the way the nginx shim drives it
(src/ngx_http_upstream_affinity_balancer.c), so that a change to the
routing is measured on a workload in seconds, deterministically, without a
real-time replay.

    module_session         session_affinity;                (its defaults)
    module_prefix          prefix_affinity;
    module_session_prefix  session_affinity; prefix_affinity;
    module_prefix_cache    prefix_affinity cache=N;  (N: the replicas' KV
    module_session_prefix_cache                       cache, in tokens)
                           session_affinity; prefix_affinity cache=N;
    module_prefix_turns0   prefix_affinity turns=0;  (no turn levels)
    module_session_prefix_turns0
                           session_affinity; prefix_affinity turns=0;

and several instances of session_affinity; prefix_affinity; behind a
random spreader (Instances; bounds.py's --store-latency, --read-lag,
--poll-lag, --poll-interval):

    module_x1_metrics      one instance, affinity_metrics
    module_x2_shared       two instances, affinity_store + affinity_metrics
    module_x4_shared       four
    module_x4_metrics      four, affinity_metrics, no store
    module_x4              four on their own
    module_x4_shared_client  four sharing, behind a front that keeps every
                           request of a session on one instance
    module_xN_shared, module_xN_shared_client  N instances (any N >= 1)

With without= (Instances, make()), some of what the instances share is
left out, on this side only (the core is the module's), to measure what
each mechanism pays (MECHANISMS):

    announcements  no 'sent' nor 'done' reaches the other instances: each
                   still announces its requests (unheard) and reads them
                   back itself, so the presumption still has its window
    presumption    no instance learns that another routes (no
                   affinity_zone_instance_seen): the core then presumes
                   nothing beside unheard requests and watches nothing
    watch          nothing is watched: read-backs teach no lesson, and the
                   presumption stays one per other instance heard from
    filled, levels, pin  that kind of message is not published

What the shim does, and this does too:
- zones: a session zone and/or a prefix zone, in memory of their own
  (bytearrays, 64-byte aligned) attached with affinity_zone_attach; the
  in-flight counters live in the session zone when there is one, else in
  the prefix zone; one worker row is claimed in that zone
  (affinity_zone_worker_claim), and requests are counted in it;
- peers: affinity_peer_id of "127.0.0.1:PORT" (the mock replicas' addresses
  in bench.py, so placements match a real run), weight 1, their counter
  slots from affinity_zone_peer_slot; the ring built with
  affinity_ring_size/affinity_ring_build, 65536 / total weight points per
  unit of weight, between 160 and 1024 (..._peers.c);
- a request: its session key (X-Session-ID, when the workload sends one)
  hashed with affinity_zone_key_hash and affinity_ring_hash; its prompt
  levels from the body the replay sends (affinity_json_load and
  affinity_json_prompt) with prefix_affinity's default schedule
  (lengths 100,500,1000, step 256, growth 6 %, max 32k:
  affinity_level_schedule; turns 8), and the body's size, or the next
  scheduled level's length when smaller, as the prompt's;
  timeouts 1h (sessions) and 10m (prefixes);
  every peer AFFINITY_PEER_USABLE; now the simulated second; the balance
  factor 1.25, slack 2 (affinity_balance's defaults);
- affinity_route, and affinity_zone_peer_release(zone, row, slot) when
  the request ends (the simulator calls release()).

The library is found (library()) as $AFFINITY_CORE_LIB, else the one make
unit builds (build/unit/core/) when it is newer than every source of the
core, else it is built in build/core/ (cmake, target affinity_core_shared)
and taken from there.
"""

import ctypes
import heapq
import os
import random
import re
import subprocess
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE_SRC = REPO / 'src' / 'core'
LIBRARY_NAME = 'libaffinity_core.so'
BUILD_DIR = REPO / 'build' / 'core'
UNIT_LIBRARY = REPO / 'build' / 'unit' / 'core' / LIBRARY_NAME

# The C API's constants (affinity_core.h).
ZONE_SESSIONS = 1
ZONE_PREFIXES = 2
PEER_USABLE = 0
NO_SLOT = 0xFFFFFFFF
NO_ROW = 0xFFFFFFFF
JSON_PADDING = 64
MAX_LEVELS = 128
ATTACH_CREATED = 0
ROUTES = ('none', 'session_hit', 'session_new', 'session_moved',
          'session_spill', 'fallback', 'prefix_hit', 'prefix_new',
          'response_hit', 'response_lost')

# The module's defaults (src/ngx_http_upstream_affinity_module.c,
# ..._peers.c, ..._zone.c).
LEVEL_LENGTHS = (100, 500, 1000)
LEVEL_STEP = 256
LEVEL_GROWTH = 6
LEVEL_MAX = 32 * 1024
LEVEL_TURNS = 8
SESSION_TIMEOUT = 3600
# affinity_metrics timeout= (the default, in milliseconds of wall_ms()):
# how long an ask of an engine waits for its answer before another may
# be made.  The simulated answers come poll_lag after the ask.
ANSWER_WITHIN_MS = 1000
PREFIX_TIMEOUT = 600
RING_TOTAL = 65536
RING_POINTS_MIN = 160
RING_POINTS_MAX = 1024
FACTOR = 1.25
SLACK = 2
# The zone sizes bench.py configures (zone=bench_sessions:16m,
# zone=bench_prefixes:32m), and the rows of a zone (at least 4).
SESSION_ZONE_BYTES = 16 * 1024 * 1024
PREFIX_ZONE_BYTES = 32 * 1024 * 1024
ZONE_ROWS = 4
# The mock replicas' first port in bench.py: peers are named after it.
BASE_PORT = 19301
# Simulated second 0 as the core's clock (any value; not 0).
NOW_ORIGIN = 1000000


def wall_ms(t):
    """The milliseconds of the wall clock the instances stamp their news
    with, and ask the engines by, at the simulation's time t."""
    return int((NOW_ORIGIN + t) * 1000)


# --- the library -------------------------------------------------------------

c_u32, c_u64 = ctypes.c_uint32, ctypes.c_uint64
WATCHED = 64        # mirrors AFFINITY_WATCHED (affinity_core.h)


class Peer(ctypes.Structure):
    _fields_ = [('id', c_u64), ('weight', c_u32), ('slot', c_u32)]


class Level(ctypes.Structure):
    _fields_ = [('length', c_u32), ('turn', c_u32), ('hash', c_u64)]


class Balance(ctypes.Structure):
    _fields_ = [('factor', ctypes.c_double), ('slack', ctypes.c_double),
                ('engine_ttl', c_u32), ('reserved', c_u32)]


class RouteRequest(ctypes.Structure):
    """affinity_request_t"""
    _fields_ = [('key_hash', c_u64), ('ring_hash', c_u64),
                ('has_key', c_u32), ('now', c_u32), ('timeout', c_u32),
                ('now_ms', c_u64),
                ('rotate', c_u32), ('row', c_u32), ('continues', c_u32),
                ('prefixes', ctypes.c_void_p),
                ('levels', ctypes.POINTER(Level)),
                ('nlevels', c_u32), ('prefix_timeout', c_u32),
                ('owner', c_u64), ('prefix_capacity', c_u64),
                ('prompt_size', c_u64)]


class Decision(ctypes.Structure):
    _fields_ = [('peer', ctypes.c_int32), ('route', c_u32),
                ('prefix_len', c_u32), ('slot', c_u32),
                ('probe_age', c_u32), ('probe_length', c_u32),
                ('cache_chars', c_u32), ('watched', ctypes.c_int32),
                ('watched_unheard', c_u32), ('queued', c_u32),
                ('held_chars', c_u32), ('estimate_us', ctypes.c_int64),
                ('alternative', ctypes.c_int32), ('backlog_chars', c_u32),
                ('alternative_us', ctypes.c_int64)]


class ReplyTimes(ctypes.Structure):
    """affinity_reply_times_t"""
    _fields_ = [('first_ms', c_u32), ('total_ms', c_u32), ('queued', c_u32),
                ('streamed', c_u32), ('prompt_chars', c_u32),
                ('prompt_tokens', c_u32), ('cached_tokens', c_u32),
                ('output_tokens', c_u32)]


PACE_QUEUES = 12                # AFFINITY_PACE_QUEUES


class PeerPace(ctypes.Structure):
    """affinity_peer_pace_t, which affinity_zone_peer_pace() fills whole:
    a mirror shorter than the C struct has its neighbours overwritten."""
    _fields_ = [('replies', c_u32), ('prefill_ns', c_u32),
                ('decode_us', c_u32), ('chars_per_token', c_u32),
                ('wait_us', ctypes.c_int64 * PACE_QUEUES),
                ('backlog_chars', c_u64)]


class EngineLoad(ctypes.Structure):
    """affinity_engine_load_t"""
    _fields_ = [('running', ctypes.c_double), ('waiting', ctypes.c_double),
                ('cache_usage', ctypes.c_double),
                ('cache_tokens', ctypes.c_double),
                ('queried_tokens', ctypes.c_double),
                ('hit_tokens', ctypes.c_double),
                ('found', c_u32), ('reserved', c_u32)]


class EngineAsked(ctypes.Structure):
    """affinity_engine_asked_t"""
    _fields_ = [('ms', c_u64), ('inflight', ctypes.c_int64)]


class PeerStats(ctypes.Structure):
    _fields_ = [('id', c_u64), ('inflight', ctypes.c_int64),
                ('requests', c_u64), ('failures', c_u64),
                ('pins', ctypes.c_int64), ('routes', c_u64 * len(ROUTES)),
                ('engine_load', ctypes.c_int64),
                ('cache_usage', ctypes.c_double),
                ('engine_time', c_u32), ('reserved', c_u32),
                ('engine_elsewhere', ctypes.c_int64),
                ('cache_tokens', c_u64), ('learned_tokens', c_u64),
                ('unheard', ctypes.c_int64)]


class UnheardWatch(ctypes.Structure):
    """affinity_unheard_watch_t: one reader's announcements watched."""
    _fields_ = [('peer', c_u64 * WATCHED), ('number', c_u32 * WATCHED),
                ('unheard', c_u32 * WATCHED), ('others', c_u32 * WATCHED),
                ('last', c_u32)]


class ZoneInfo(ctypes.Structure):
    _fields_ = [('kind', c_u32), ('layout_version', c_u32), ('seed', c_u64),
                ('capacity', c_u64), ('used', c_u64), ('inserts', c_u64),
                ('evictions', c_u64),
                ('expiries', c_u64), ('peer_slots', c_u32),
                ('peer_slots_used', c_u32), ('peer_slots_reclaimed', c_u32),
                ('rows', c_u32), ('peer_slots_missing', c_u64),
                ('rows_used', c_u32), ('reserved', c_u32),
                ('rows_missing', c_u64), ('rows_reaped', c_u64),
                ('inflight_recovered', c_u64),
                ('fallbacks', c_u64 * 8),   # AFFINITY_FALLBACKS
                ('instance', c_u64), ('conflicts', c_u64)]


P = ctypes.POINTER
SIGNATURES = {
    'affinity_peer_id': (c_u64, [ctypes.c_char_p, ctypes.c_size_t]),
    'affinity_ring_hash': (c_u64, [ctypes.c_char_p, ctypes.c_size_t]),
    'affinity_zone_peer_pace': (None, [ctypes.c_void_p, c_u32, P(PeerPace)]),
    'affinity_ring_size': (ctypes.c_size_t, [P(Peer), ctypes.c_size_t,
                                             c_u32]),
    'affinity_ring_build': (ctypes.c_void_p, [
        ctypes.c_void_p, ctypes.c_size_t, P(Peer), ctypes.c_size_t, c_u32]),
    'affinity_ring_walk': (ctypes.c_size_t, [ctypes.c_void_p, c_u64,
                                             P(c_u32), ctypes.c_size_t]),
    'affinity_zone_attach': (ctypes.c_int, [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, c_u32,
        P(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]),
    'affinity_zone_info': (None, [ctypes.c_void_p, P(ZoneInfo)]),
    'affinity_zone_key_hash': (c_u64, [ctypes.c_void_p, ctypes.c_char_p,
                                       ctypes.c_size_t]),
    'affinity_zone_peer_slot': (c_u32, [ctypes.c_void_p, c_u64, c_u32]),
    'affinity_zone_peer_release': (None, [ctypes.c_void_p, c_u32, c_u32]),
    'affinity_zone_peer_started': (None, [ctypes.c_void_p, c_u32, c_u32]),
    'affinity_zone_peer_timed': (None, [ctypes.c_void_p, c_u32, c_u64,
                                        P(ReplyTimes)]),
    'affinity_zone_peer_stats': (None, [ctypes.c_void_p, c_u32,
                                        P(PeerStats)]),
    'affinity_zone_worker_claim': (c_u32, [ctypes.c_void_p, c_u64, c_u64,
                                           c_u32]),
    'affinity_process_start': (c_u64, [c_u64]),
    'affinity_level_schedule': (ctypes.c_size_t, [
        P(c_u32), ctypes.c_size_t, c_u32, c_u32, c_u32, P(c_u32),
        ctypes.c_size_t]),
    'affinity_json_create': (ctypes.c_void_p, [ctypes.c_size_t]),
    'affinity_json_destroy': (None, [ctypes.c_void_p]),
    'affinity_json_load': (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                          ctypes.c_size_t]),
    'affinity_json_unload': (None, [ctypes.c_void_p]),
    'affinity_json_prompt': (ctypes.c_int, [
        ctypes.c_void_p, P(c_u32), ctypes.c_size_t, ctypes.c_size_t,
        P(Level), ctypes.c_size_t, P(ctypes.c_size_t)]),
    'affinity_route': (ctypes.c_int, [
        ctypes.c_void_p, ctypes.c_void_p, P(Peer), P(ctypes.c_uint8),
        ctypes.c_size_t, P(Balance), P(RouteRequest), P(Decision)]),
    'affinity_prefixes_replied': (None, [
        ctypes.c_void_p, c_u64, c_u32, c_u32, c_u64, c_u64, c_u64]),
    # affinity_metrics: the engines' figures
    'affinity_engine_ask': (ctypes.c_int, [ctypes.c_void_p, c_u32,
                                                c_u64, c_u64,
                                                P(EngineAsked)]),
    'affinity_engine_answer': (ctypes.c_int, [ctypes.c_void_p, c_u32,
                                                 P(EngineLoad), c_u32,
                                                 P(EngineAsked)]),
    'affinity_prefixes_polled': (None, [ctypes.c_void_p, c_u64,
                                        P(EngineLoad), c_u64]),
    # affinity_store: what the other instances announce
    'affinity_zone_peer_sent_elsewhere': (None, [ctypes.c_void_p, c_u64,
                                                 c_u64]),
    'affinity_zone_peer_ended_elsewhere': (None, [ctypes.c_void_p, c_u64,
                                                  c_u64]),
    'affinity_zone_peer_announced': (ctypes.c_size_t,
                                     [ctypes.c_void_p, c_u32]),
    'affinity_zone_peer_heard': (None, [ctypes.c_void_p, ctypes.c_size_t]),
    'affinity_zone_unheard_met': (None, [ctypes.c_void_p, c_u32, c_u32]),
    'affinity_zone_unheard_presumed': (ctypes.c_double, [
        ctypes.c_void_p, c_u32, P(c_u32), P(c_u32)]),
    'affinity_watch_announced': (c_u32, [P(UnheardWatch), c_u64,
                                         ctypes.c_int64]),
    'affinity_watch_sent_elsewhere': (None, [P(UnheardWatch), c_u64]),
    'affinity_watch_read_back': (ctypes.c_int, [P(UnheardWatch), c_u32,
                                                P(c_u32), P(c_u32)]),
    'affinity_zone_instance_seen': (None, [ctypes.c_void_p, c_u64, c_u32]),
    'affinity_sessions_learn': (ctypes.c_int, [ctypes.c_void_p, c_u64, c_u64,
                                               c_u64, c_u32, c_u32]),
    'affinity_prefixes_record': (None, [ctypes.c_void_p, P(c_u64),
                                        ctypes.c_size_t, c_u64, c_u32, c_u32,
                                        c_u64]),
    'affinity_prefixes_filled': (None, [ctypes.c_void_p, c_u64, c_u32, c_u32,
                                        c_u64]),
}

# affinity_engine_load_t.found
ENGINE_RUNNING, ENGINE_WAITING, ENGINE_CACHE = 1, 2, 4
ENGINE_CAPACITY, ENGINE_COMPUTED = 8, 16


def _sources():
    return [p for p in CORE_SRC.rglob('*')
            if p.suffix in ('.cpp', '.h') or p.name == 'CMakeLists.txt']


def _fresh(path):
    """Whether a built library is newer than every source of the core."""
    try:
        built = path.stat().st_mtime
    except FileNotFoundError:
        return False
    return all(src.stat().st_mtime <= built for src in _sources())


def build(build_dir=BUILD_DIR, jobs=2, options=()):
    """Configures (once) and builds the shared library in build_dir, with
    CMake options; returns its path."""
    build_dir = Path(build_dir)
    if not (build_dir / 'CMakeCache.txt').exists():
        subprocess.run(['cmake', '-S', str(CORE_SRC), '-B', str(build_dir),
                        '-DCMAKE_BUILD_TYPE=RelWithDebInfo', *options],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(['cmake', '--build', str(build_dir), '--target',
                    'affinity_core_shared', '-j', str(jobs)], check=True,
                   stdout=subprocess.DEVNULL)
    return build_dir / LIBRARY_NAME


def library_path():
    """$AFFINITY_CORE_LIB, or an up-to-date build of the core's sources;
    with AFFINITY_TRACE=1, a build that traces every decision on stderr
    (src/core/trace.h), in a directory of its own."""
    env = os.environ.get('AFFINITY_CORE_LIB')
    if env:
        return Path(env)
    if os.environ.get('AFFINITY_TRACE', '0') not in ('', '0'):
        traced = BUILD_DIR.parent / (BUILD_DIR.name + '-trace')
        if not _fresh(traced / LIBRARY_NAME):
            build(traced, options=['-DAFFINITY_TRACE=ON'])
        return traced / LIBRARY_NAME
    for candidate in (BUILD_DIR / LIBRARY_NAME, UNIT_LIBRARY):
        if _fresh(candidate):
            return candidate
    return build()


_library = None


def library():
    """The core, loaded once per process, its C API declared."""
    global _library
    if _library is None:
        lib = ctypes.CDLL(str(library_path()))
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _library = lib
    return _library


# --- zones, peers, levels -----------------------------------------------------

class Zone:
    """A zone in memory of its own, 64-byte aligned."""

    def __init__(self, lib, kind, size, rows=ZONE_ROWS):
        self.memory = ctypes.create_string_buffer(size + 64)
        address = ctypes.addressof(self.memory)
        self.region = address + (-address % 64)
        self.handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(160)
        rc = lib.affinity_zone_attach(self.region, size, kind, rows,
                                      ctypes.byref(self.handle), err,
                                      len(err))
        if not self.handle.value or rc != ATTACH_CREATED:
            raise RuntimeError('affinity_zone_attach: %s (%d)'
                               % (err.value.decode(errors='replace'), rc))
        self.lib = lib

    def info(self):
        info = ZoneInfo()
        self.lib.affinity_zone_info(self.handle, ctypes.byref(info))
        out = {name: getattr(info, name) for name, _ in ZoneInfo._fields_
               if name != 'reserved'}
        out['fallbacks'] = list(out['fallbacks'])
        return out


def ring_points(weights):
    """Points per unit of weight, as the module computes them."""
    total = max(sum(weights), 1)
    return min(max(RING_TOTAL // total, RING_POINTS_MIN), RING_POINTS_MAX)


class Ring:
    """The module's ring of peers named "127.0.0.1:PORT" (weight 1), as
    ..._peers.c builds it: peers (an array of Peer, slots unset) and
    first(key), the peer a new session key lands on before the load
    bound."""

    def __init__(self, lib, names):
        self.lib = lib
        n = len(names)
        self.peers = (Peer * n)()
        for i, name in enumerate(names):
            raw = name.encode()
            self.peers[i].id = lib.affinity_peer_id(raw, len(raw))
            self.peers[i].weight = 1
            self.peers[i].slot = NO_SLOT
        points = ring_points([1] * n)
        size = lib.affinity_ring_size(self.peers, n, points)
        self.memory = (ctypes.c_uint64 * (size // 8 + 1))()
        self.ring = lib.affinity_ring_build(self.memory, size, self.peers,
                                            n, points)
        if not self.ring:
            raise RuntimeError('affinity_ring_build failed')
        self.out = (c_u32 * 1)()

    def first(self, key):
        raw = key.encode()
        self.lib.affinity_ring_walk(self.ring,
                                    self.lib.affinity_ring_hash(raw, len(raw)),
                                    self.out, 1)
        return self.out[0]


def level_schedule(lib, lengths=LEVEL_LENGTHS, step=LEVEL_STEP,
                   growth=LEVEL_GROWTH, maximum=LEVEL_MAX):
    """prefix_affinity's level lengths (affinity_level_schedule)."""
    given = (c_u32 * len(lengths))(*lengths)
    out = (c_u32 * MAX_LEVELS)()
    n = lib.affinity_level_schedule(given, len(lengths), step, growth,
                                    maximum, out, MAX_LEVELS)
    return (c_u32 * n)(*out[:n])


class PromptLevels:
    """The prompt levels of request bodies, as the module hashes them."""

    def __init__(self, lib, schedule, turns=LEVEL_TURNS):
        self.lib = lib
        self.schedule = schedule
        self.turns = turns
        self.json = lib.affinity_json_create(1 << 20)
        if not self.json:
            raise MemoryError('affinity_json_create')
        self.out = (Level * MAX_LEVELS)()

    def __del__(self):
        if getattr(self, 'json', None):
            self.lib.affinity_json_destroy(self.json)
            self.json = None

    def levels(self, body):
        """The levels of a body (bytes) packed as bytes (16 per level),
        b'' for a body without a prompt."""
        buffer = ctypes.create_string_buffer(body, len(body) + JSON_PADDING)
        if self.lib.affinity_json_load(self.json, buffer, len(body)) != 0:
            return b''
        try:
            n = ctypes.c_size_t()
            rc = self.lib.affinity_json_prompt(
                self.json, self.schedule, len(self.schedule), self.turns,
                self.out, MAX_LEVELS, ctypes.byref(n))
            if rc != 0:
                return b''
            return ctypes.string_at(self.out, n.value * ctypes.sizeof(Level))
        finally:
            self.lib.affinity_json_unload(self.json)


# --- the policy -----------------------------------------------------------------

def engine_reports(fleet):
    """What every replica's engine reports now (EngineLoad each): its
    running and waiting requests, its KV cache's size and the prompt
    tokens it computed (queried less cached)."""
    reports = []
    for rep in fleet.replicas:
        figures = rep.stats()
        load = EngineLoad()
        load.running = figures['running']
        load.waiting = figures['waiting']
        load.cache_usage = min(1.0, figures['cache_blocks']
                               / rep.params.cache_blocks)
        load.cache_tokens = fleet.params.cache_tokens
        load.queried_tokens = figures['queried_tokens_total']
        load.hit_tokens = figures['cached_tokens_total']
        load.found = (ENGINE_RUNNING | ENGINE_WAITING | ENGINE_CACHE
                      | ENGINE_CAPACITY | ENGINE_COMPUTED)
        reports.append(load)
    return reports


class ModulePolicy:
    """A bounds.py policy routing with the module's core; see the module
    docstring.  session and prefix say which directives the upstream has."""

    def __init__(self, replicas, session=True, prefix=True, factor=FACTOR,
                 slack=SLACK, base_port=BASE_PORT, seed=1, lib=None,
                 cache=False, turns=LEVEL_TURNS, engine_ttl=0, shares=False):
        if not (session or prefix):
            raise ValueError('the module needs a session or a prefix zone')
        self.name = 'module_' + '_'.join(
            n for n, on in (('session', session), ('prefix', prefix),
                            ('cache', cache),
                            ('turns%d' % turns, turns != LEVEL_TURNS))
            if on)
        self.cache = cache and prefix
        self.lib = lib = lib or library()
        self.sessions = Zone(lib, ZONE_SESSIONS, SESSION_ZONE_BYTES) \
            if session else None
        self.prefixes = Zone(lib, ZONE_PREFIXES, PREFIX_ZONE_BYTES) \
            if prefix else None
        self.counter = self.sessions or self.prefixes
        # its reader's watch over its announcements (affinity_store)
        self.watch = UnheardWatch()
        now = NOW_ORIGIN
        pid = os.getpid()
        self.row = lib.affinity_zone_worker_claim(
            self.counter.handle, pid, lib.affinity_process_start(pid), now)
        self.placement = Ring(lib, ['127.0.0.1:%d' % (base_port + i)
                                    for i in range(replicas)])
        self.peers = self.placement.peers
        self.ring = self.placement.ring
        for peer in self.peers:
            peer.slot = lib.affinity_zone_peer_slot(self.counter.handle,
                                                    peer.id, now)
        self.states = (ctypes.c_uint8 * replicas)(*[PEER_USABLE] * replicas)
        # engine_ttl: affinity_metrics (the figures' lifetime, seconds)
        self.balance = Balance(factor, slack, engine_ttl)
        # shares: what each decision teaches is kept in self.taught, for
        # the other instances (Instances)
        self.shares = shares
        self.taught = None
        # prefix_affinity cache= as the store applies it (0: the engines')
        self._capacity = 0
        self.replicas = replicas
        self.levels = PromptLevels(lib, level_schedule(lib), turns) \
            if prefix else None
        self.rng = random.Random(seed)
        self.routes = dict.fromkeys(ROUTES, 0)
        self.request = RouteRequest()
        self.decision = Decision()

    def _levels(self, req):
        """The request's levels, computed once (kept in req.memo)."""
        memo = req.memo
        if memo is None:
            memo = req.memo = {}
        name = 'levels/%d' % self.levels.turns  # policies differ in turns
        packed = memo.get(name)
        if packed is None:
            if req.source is None:
                raise ValueError('module_prefix needs the request body '
                                 '(bounds.prepare_workload)')
            packed = memo[name] = self.levels.levels(
                req.source.body_bytes())
        return packed

    def choose(self, req, chain, fleet):
        lib = self.lib
        request = self.request
        ctypes.memset(ctypes.byref(request), 0, ctypes.sizeof(request))
        if self.sessions is not None and req.key is not None:
            key = req.key.encode()
            request.has_key = 1
            request.key_hash = lib.affinity_zone_key_hash(
                self.sessions.handle, key, len(key))
            request.ring_hash = lib.affinity_ring_hash(key, len(key))
        levels = None
        if self.prefixes is not None:
            packed = self._levels(req)
            if packed:
                n = len(packed) // ctypes.sizeof(Level)
                levels = (Level * n).from_buffer_copy(packed)
                request.prefixes = self.prefixes.handle
                request.levels = levels
                request.nlevels = n
                request.prefix_timeout = PREFIX_TIMEOUT
                # prefix_affinity cache=: the replicas' own KV cache size
                if self.cache:
                    request.prefix_capacity = fleet.params.cache_tokens
                    self._capacity = fleet.params.cache_tokens
                # the prompt's size from above, as the shim gives it: its
                # body's, and below the next level it did not reach
                schedule = self.levels.schedule
                scheduled = [lv.length for lv in levels if not lv.turn]
                m = len(scheduled)
                if m and scheduled[-1] == schedule[m - 1]:
                    size = len(req.source.body_bytes())
                    request.prompt_size = size if m == len(schedule) \
                        else min(size, schedule[m])
        request.now = NOW_ORIGIN + int(req.arrival)
        request.now_ms = wall_ms(req.arrival)
        request.timeout = SESSION_TIMEOUT
        request.rotate = self.rng.getrandbits(32)
        request.row = self.row
        decision = self.decision
        rc = lib.affinity_route(self.counter.handle, self.ring, self.peers,
                                self.states, self.replicas,
                                ctypes.byref(self.balance),
                                ctypes.byref(request),
                                ctypes.byref(decision))
        if rc != 0 or decision.peer < 0:
            raise RuntimeError('affinity_route found no peer')
        self.routes[ROUTES[decision.route] if decision.route < len(ROUTES)
                    else str(decision.route)] += 1
        if self.shares:
            # What ..._balancer.c publishes (ngx_http_upstream_affinity_
            # share): the peer, how far the prompt filled its modelled
            # cache, the key unless its pin held, the levels.
            self.taught = (
                self.peers[decision.peer].id, decision.cache_chars,
                key if request.has_key and self.sessions is not None
                and ROUTES[decision.route] != 'session_hit' else None,
                [lv.hash for lv in levels] if levels is not None else None)
            # the peer it weighed beside unheard requests, for announced()
            self.watched = (self.peers[decision.watched].id
                            if decision.watched >= 0 else 0,
                            decision.watched_unheard)
        # A probe taken: the reply's cached tokens go back to the core, as
        # the shim reads them from the reply's usage.
        chars = request.prompt_size
        if levels is not None:
            chars = max(chars, levels[len(levels) - 1].length)
        probe = None
        if decision.probe_length:
            probe = (self.peers[decision.peer].id, decision.probe_age,
                     decision.probe_length, chars)
        # What the reply's times are learned with (..._usage.c): the peer,
        # the requests it had in flight, the prompt's characters.
        timing = (self.peers[decision.peer].id, decision.queued,
                  chars or len(req.source.body_bytes())
                  if req.source is not None else chars)
        return decision.peer, (decision.slot, probe, timing,
                               decision.backlog_chars)

    def replied(self, token, cached_tokens, prompt_tokens, first_s=None,
                total_s=None, output_tokens=0):
        """The request of token (choose()) was answered: with a probe, its
        cached and prompt tokens teach its replica's cache size; its first
        token after first_s seconds and its last after total_s, streamed,
        teach its replica's pace (affinity_zone_peer_timed)."""
        slot, probe, timing, _ = token
        if probe is not None:
            peer_id, age, length, chars = probe
            self.lib.affinity_prefixes_replied(
                self.prefixes.handle, peer_id, age, length, chars,
                cached_tokens, prompt_tokens)
        if first_s is not None and slot != NO_SLOT:
            peer_id, queued, chars = timing
            times = ReplyTimes(int(first_s * 1000), int(total_s * 1000),
                               queued, 1, min(chars, 2**32 - 1),
                               prompt_tokens, cached_tokens, output_tokens)
            self.lib.affinity_zone_peer_timed(self.counter.handle, slot,
                                              peer_id, ctypes.byref(times))

    def started(self, token):
        """The request of token (choose()) got its first token: its
        prefill leaves its replica's backlog (affinity_zone_peer_started),
        as ..._usage.c does at a stream's first byte."""
        slot, backlog = token[0], token[3]
        if slot != NO_SLOT:
            self.lib.affinity_zone_peer_started(self.counter.handle, slot,
                                                backlog)

    def release(self, token):
        """The request of token (choose()) has ended."""
        slot = token[0]
        if slot != NO_SLOT:
            self.lib.affinity_zone_peer_release(self.counter.handle,
                                                self.row, slot)

    # --- affinity_metrics and affinity_store ---------------------------

    def polled(self, fleet, now, asked_ms):
        """Every replica's engine reports, as ..._metrics.c applies a
        reply: its running and waiting requests, its KV cache's size and
        the prompt tokens it computed (queried less cached), at now
        (seconds of the core's clock), asked at asked_ms (wall_ms())."""
        self.apply_reports(engine_reports(fleet), now, self.asked(asked_ms))

    def asked(self, ms):
        """Every replica's engine is asked at ms (wall_ms()): what
        apply_reports() takes with their reports.  An engine that still
        owes an earlier ask its answer is not asked again (its EngineAsked
        stays at 0 ms, and the core drops the report made with it)."""
        asked = [EngineAsked() for _ in self.peers]
        for peer, a in zip(self.peers, asked):
            self.lib.affinity_engine_ask(self.counter.handle, peer.slot,
                                         ms, ANSWER_WITHIN_MS,
                                         ctypes.byref(a))
        return asked

    def apply_reports(self, reports, now, asked):
        """The engines' reports (engine_reports()), as they were asked
        (asked()), applied at now: as ..._metrics.c does, a report the
        counter zone did not await goes nowhere."""
        lib = self.lib
        for r, load in enumerate(reports):
            capacity = load.cache_tokens if self.cache else 0
            slot = self.peers[r].slot
            taken = lib.affinity_engine_answer(self.counter.handle, slot,
                                               ctypes.byref(load), now,
                                               ctypes.byref(asked[r]))
            if not taken and slot != NO_SLOT:
                continue
            if self.prefixes is not None:
                lib.affinity_prefixes_polled(self.prefixes.handle,
                                             self.peers[r].id,
                                             ctypes.byref(load), capacity)

    def announced(self, slot, watch=True):
        """This instance told the store of its last request, on slot (as
        ..._store.c writes a SENT message, its reader watching what the
        decision weighed, unless not watch): what to pass heard()."""
        lib = self.lib
        ticket = lib.affinity_zone_peer_announced(self.counter.handle, slot)
        number = lib.affinity_watch_announced(ctypes.byref(self.watch),
                                              *self.watched) \
            if ticket and watch else 0
        return ticket, number

    def heard(self, announcement):
        """This instance read back its SENT message (announced()): heard,
        and what the unheard beside it met learned."""
        ticket, number = announcement
        lib = self.lib
        lib.affinity_zone_peer_heard(self.counter.handle, ticket)
        unheard, others = c_u32(), c_u32()
        if number and lib.affinity_watch_read_back(
                ctypes.byref(self.watch), number, ctypes.byref(unheard),
                ctypes.byref(others)):
            lib.affinity_zone_unheard_met(self.counter.handle, unheard.value,
                                          others.value)

    def unheard_presumed(self, now):
        """What routing presumes beside each unheard request, and the
        unheard requests learned from (affinity_zone_unheard_presumed())."""
        learned = c_u32()
        presumed = self.lib.affinity_zone_unheard_presumed(
            self.counter.handle, now, ctypes.byref(learned), None)
        return presumed, learned.value

    def heard_from(self, instance, now):
        """A message of another instance (its zone's seed) was read."""
        self.lib.affinity_zone_instance_seen(self.counter.handle, instance,
                                             now)

    def apply(self, kind, peer_id, payload, now, stamped_ms):
        """A message another instance published at stamped_ms
        (wall_ms()), as ..._store.c applies it: 'sent' and 'done' (a
        request started or ended on peer_id), 'filled' (payload:
        characters), 'pin' (payload: the raw key), 'levels' (payload: the
        level hashes)."""
        lib = self.lib
        if kind == 'sent':
            if self.balance.engine_ttl:
                lib.affinity_zone_peer_sent_elsewhere(self.counter.handle,
                                                      peer_id, stamped_ms)
                lib.affinity_watch_sent_elsewhere(ctypes.byref(self.watch),
                                                  peer_id)
        elif kind == 'done':
            if self.balance.engine_ttl:
                lib.affinity_zone_peer_ended_elsewhere(self.counter.handle,
                                                       peer_id, stamped_ms)
        elif kind == 'filled':
            if self.prefixes is not None:
                lib.affinity_prefixes_filled(self.prefixes.handle, peer_id,
                                             payload, now, self._capacity)
        elif kind == 'pin':
            if self.sessions is not None:
                lib.affinity_sessions_learn(
                    self.sessions.handle,
                    lib.affinity_zone_key_hash(self.sessions.handle,
                                               payload, len(payload)),
                    peer_id, stamped_ms, now, SESSION_TIMEOUT)
        elif kind == 'levels':
            if self.prefixes is not None:
                hashes = (c_u64 * len(payload))(*payload)
                lib.affinity_prefixes_record(self.prefixes.handle, hashes,
                                             len(payload), peer_id, now,
                                             PREFIX_TIMEOUT, self._capacity)
        else:
            raise ValueError('unknown message kind %r' % kind)

    def peer_stats(self):
        """Each peer's counters in the zone (in-flight, requests, pins)."""
        out = []
        for peer in self.peers:
            stats = PeerStats()
            self.lib.affinity_zone_peer_stats(self.counter.handle, peer.slot,
                                              ctypes.byref(stats))
            out.append({'inflight': stats.inflight,
                        'requests': stats.requests, 'pins': stats.pins,
                        'engine_load': stats.engine_load,
                        'elsewhere': stats.engine_elsewhere,
                        'unheard': stats.unheard})
        return out

    def stats(self):
        out = {'routes': {k: v for k, v in self.routes.items() if v}}
        for label, zone in (('session_zone', self.sessions),
                            ('prefix_zone', self.prefixes)):
            if zone is not None:
                info = zone.info()
                out[label] = {k: info[k] for k in ('capacity', 'used',
                                                   'evictions', 'expiries')}
        return out


class Instances:
    """Several nginx instances of the module (both directives) in front of
    the fleet, behind a spreader that sends each request to one of them at
    random, as bench.py's x2_shared and x4_shared run them: each routes
    with zones of its own (a ModulePolicy); with metrics, each polls every
    engine every interval seconds (affinity_metrics), the instances taking
    turns at evenly spread phases; with store, what each decision teaches
    reaches the instances' readers latency seconds later, and each reader
    up to 2 * read_lag seconds more (at random: a loaded host runs it
    late), its sender's reader too, each reading the messages in the
    order the store took them (affinity_store): the request
    itself as load and its end (with metrics), how far the prompt filled
    its peer's modelled cache, a new or moved pin, the prompt's levels, in
    the order ..._balancer.c publishes them.  A request stays announced
    in its instance's zone (unheard) until its sender reads it back, which
    then learns what the unheard ones beside it met (..._store.c), and
    each delivery tells the others the sender is routing, as ..._store.c
    does.

    Polls and deliveries are timers of the simulation (next_timer(),
    timer()), taken at their own times between the fleet's events.  In the
    real stack a poll's figures are some milliseconds old when they are
    applied, and in a replay faster than real time those milliseconds are
    many more of the workload's: poll_lag seconds here.

    without: mechanisms (MECHANISMS) left out, for ablations; see the
    module docstring."""

    def __init__(self, replicas, count, store=True, metrics=True,
                 interval=2.0, latency=0.0, factor=FACTOR, slack=SLACK,
                 base_port=BASE_PORT, seed=1, lib=None, cache=False,
                 name=None, read_lag=0.0, poll_lag=0.0, by_client=False,
                 without=()):
        unknown = set(without) - set(MECHANISMS)
        if unknown:
            raise ValueError('unknown mechanisms: %s'
                             % ', '.join(sorted(unknown)))
        self.without = frozenset(without)
        lib = lib or library()
        # affinity_metrics: figures live three intervals, at least 2 s
        ttl = max(2, int(3 * interval + 0.999)) if metrics else 0
        self.members = [ModulePolicy(replicas, True, True, factor, slack,
                                     base_port, seed + i, lib, cache,
                                     engine_ttl=ttl, shares=store)
                        for i in range(count)]
        self.name = name or 'module_x%d%s' % (count, {
            (True, True): '_shared', (False, True): '_metrics',
            (True, False): '_store', (False, False): ''}[store, metrics])
        self.store, self.metrics = store, metrics
        self.interval, self.latency = interval, latency
        self.read_lag, self.poll_lag = read_lag, poll_lag
        self.spread = random.Random(seed)
        # bench.py's x4_shared_client: every request of a session through
        # the same instance, as a front that hashes the client does
        self.by_client = by_client
        self.lag = random.Random(seed + 1)
        self.read_at = [0.0] * count    # when each reader read its last
        self.seeds = [m.counter.info()['seed'] for m in self.members]
        self.next_poll = [interval * i / count for i in range(count)] \
            if metrics else []
        # (due, seq, reader, origin, kind, peer, payload, stamped)
        self.pending = []
        self.seq = 0
        self.now = 0.0
        self.fleet = None

    def _know(self, fleet):
        """The fleet, once: the members' cache= is its replicas' size."""
        if self.fleet is None:
            self.fleet = fleet
            for member in self.members:
                if member.cache:
                    member._capacity = fleet.params.cache_tokens

    def _publish(self, origin, kind, peer_id, payload, others=True):
        """A message for every instance's reader, its sender's too (only
        its sender's unless others)."""
        taken = self.now + self.latency
        for reader in range(len(self.members)) if others else (origin,):
            due = taken
            if self.read_lag:
                # a stream is read in order
                due = max(due + self.lag.uniform(0, 2 * self.read_lag),
                          self.read_at[reader])
                self.read_at[reader] = due
            self.seq += 1
            heapq.heappush(self.pending, (due, self.seq, reader, origin,
                                          kind, peer_id, payload, self.now))

    def next_timer(self):
        """When the next message is due or the next poll is, or inf."""
        due = self.pending[0][0] if self.pending else float('inf')
        return min([due] + self.next_poll)

    def timer(self, now, fleet):
        """At now: the messages due are applied by the other instances,
        and the instances whose poll is due read the engines."""
        self._know(fleet)
        self.now = max(self.now, now)
        pending = self.pending
        while pending and pending[0][0] <= self.now:
            due, _, reader, origin, kind, peer_id, payload, stamped = \
                heapq.heappop(pending)
            member = self.members[reader]
            if kind == 'polled':
                # the engines' reports, poll_lag after they were made
                reports, asked = payload
                member.apply_reports(reports, NOW_ORIGIN + int(due), asked)
                continue
            if reader == origin:
                if kind == 'sent':
                    # read back: the others read it about now
                    member.heard(payload)
                continue
            if self.metrics and 'presumption' not in self.without:
                member.heard_from(self.seeds[origin], NOW_ORIGIN + int(due))
            member.apply(kind, peer_id, payload, NOW_ORIGIN + int(due),
                         wall_ms(stamped))
        for i, member in enumerate(self.members):
            if self.next_poll and self.next_poll[i] <= self.now:
                if self.poll_lag:
                    self.seq += 1
                    asked = member.asked(wall_ms(self.now))
                    heapq.heappush(pending, (self.now + self.poll_lag,
                                             self.seq, i, i, 'polled', None,
                                             (engine_reports(fleet), asked),
                                             self.now))
                else:
                    member.polled(fleet, NOW_ORIGIN + int(self.now),
                                  wall_ms(self.now))
                while self.next_poll[i] <= self.now:
                    self.next_poll[i] += self.interval

    def at(self, now):
        """The simulation's time, as a request ends (release())."""
        self.now = max(self.now, now)

    def choose(self, req, chain, fleet):
        self._know(fleet)
        self.now = max(self.now, req.arrival)
        if self.by_client:
            k = zlib.crc32(req.session.encode()) % len(self.members)
        else:
            k = self.spread.randrange(len(self.members))
        member = self.members[k]
        peer, token = member.choose(req, chain, fleet)
        if self.store:
            peer_id, chars, key, levels = member.taught
            without = self.without
            if self.metrics:
                # announced until its sender reads it back (timer())
                self._publish(k, 'sent', peer_id,
                              member.announced(token[0],
                                               'watch' not in without),
                              'announcements' not in without)
            if chars and 'filled' not in without:
                self._publish(k, 'filled', peer_id, chars)
            if key is not None and 'pin' not in without:
                self._publish(k, 'pin', peer_id, key)
            if levels and 'levels' not in without:
                self._publish(k, 'levels', peer_id, levels)
        return peer, (k, token, member.peers[peer].id)

    def replied(self, token, cached_tokens, prompt_tokens, *times):
        k, inner, _ = token
        self.members[k].replied(inner, cached_tokens, prompt_tokens, *times)

    def started(self, token):
        k, inner, _ = token
        self.members[k].started(inner)

    def release(self, token):
        k, inner, peer_id = token
        self.members[k].release(inner)
        if self.store and self.metrics \
                and 'announcements' not in self.without:
            self._publish(k, 'done', peer_id, None)

    def peer_stats(self):
        """Each peer's requests in flight and routed, summed over the
        instances (each counts its own)."""
        out = None
        for member in self.members:
            stats = member.peer_stats()
            if out is None:
                out = [{'inflight': 0, 'requests': 0} for _ in stats]
            for total, one in zip(out, stats):
                total['inflight'] += one['inflight']
                total['requests'] += one['requests']
        return out

    def stats(self):
        out = {'routes': {}}
        for member in self.members:
            for name, n in member.stats()['routes'].items():
                out['routes'][name] = out['routes'].get(name, 0) + n
        return out


POLICIES = {
    'module_session': dict(session=True, prefix=False),
    'module_prefix': dict(session=False, prefix=True),
    'module_session_prefix': dict(session=True, prefix=True),
    # prefix_affinity cache=, set to the replicas' KV cache size
    'module_prefix_cache': dict(session=False, prefix=True, cache=True),
    'module_session_prefix_cache': dict(session=True, prefix=True,
                                        cache=True),
    # prefix_affinity turns=0: the scheduled levels only
    'module_prefix_turns0': dict(session=False, prefix=True, turns=0),
    'module_session_prefix_turns0': dict(session=True, prefix=True,
                                         turns=0),
}


# Several instances (Instances), as bench.py's policies of the same names
# with the module_ prefix: (instances, store, metrics).
INSTANCE_POLICIES = {
    'module_x1_metrics': (1, False, True),
    'module_x2_shared': (2, True, True),
    'module_x4_shared': (4, True, True),
    'module_x4_metrics': (4, False, True),
    'module_x4': (4, False, False),
    'module_x4_shared_client': (4, True, True),
}
# Those behind a front that keeps each session (client) on one instance.
BY_CLIENT = ('module_x4_shared_client',)
# Any number of instances sharing: module_xN_shared[_client].
SHARED_NAME = re.compile(r'module_x([1-9][0-9]*)_shared(_client)?$')
# What Instances(without=) may leave out.
MECHANISMS = ('announcements', 'presumption', 'watch', 'filled', 'levels',
              'pin')


def instance_policy(name):
    """(instances, store, metrics, by_client) of a policy of several
    instances, or None."""
    if name in INSTANCE_POLICIES:
        return INSTANCE_POLICIES[name] + (name in BY_CLIENT,)
    match = SHARED_NAME.match(name)
    if match:
        return int(match.group(1)), True, True, bool(match.group(2))
    return None


def make(name, replicas, factor=FACTOR, slack=SLACK, base_port=BASE_PORT,
         latency=0.0, interval=2.0, read_lag=0.0, poll_lag=0.0, without=()):
    """The policy of this name; latency, interval, read_lag, poll_lag,
    without: Instances'."""
    spec = instance_policy(name)
    if spec is not None:
        count, store, metrics, by_client = spec
        return Instances(replicas, count, store, metrics, interval, latency,
                         factor=factor, slack=slack, base_port=base_port,
                         name=name, read_lag=read_lag, poll_lag=poll_lag,
                         by_client=by_client, without=without)
    if without:
        raise ValueError('without= is for several instances')
    return ModulePolicy(replicas, factor=factor, slack=slack,
                        base_port=base_port, **POLICIES[name])
