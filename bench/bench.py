#!/usr/bin/env python3
"""Replays workloads against a simulated inference fleet behind each load
balancing policy in turn -- real nginx with the module (or HAProxy) in
front of the mock replicas, over HTTP -- and compares them with what an
oracle router reaches on the same workload offline.

    bench/bench.py --quick                  tight profile, every workload
                                            but long-mix, with and without
                                            sessions, one seed, short
                                            slices, the module's default
                                            policies, two nginx peers and
                                            the oracle's choices replayed
                                            (< 10 min)
    bench/bench.py                          tight and roomy, every workload,
                                            both session modes, 3 seeds,
                                            every main policy (hours)
    bench/bench.py --profile tight --workload chat --sessions off \\
        --seeds 1 --policies session_prefix,least_conn
    bench/bench.py --levels                 prefix_affinity's level
                                            variants on the trace (roomy)
    bench/bench.py --instances              1, 2 and 4 instances of the
                                            module behind a random spreader,
                                            on their own and sharing a Redis
                                            store (tight, quick slices, the
                                            conversation trace's requests
                                            spread over their 3-s ticks)

Workloads (bench/sim/workloads.py): conversation (slices of the Mooncake
trace: seed N is slice N), shared-docs, agentic, chat and long-mix (chat
with a few 30,000 to 100,000-token prompts; not in --quick or
--instances), generated and seeded 1..N.  Profiles
(bench/sim/profiles.py): tight (8 replicas of 4 running slots, caches of a
quarter of the workload's distinct prompt blocks over the fleet, 1.2x the
workload's rate) and roomy (4 x 32 slots, 4M-token caches, its own
rate).  Sessions on: every request carries its session's
X-Session-ID; off: no request does.

For each profile, workload and seed: the offline simulator (bounds.py)
runs first -- it sizes the tight caches, and gives the oracle's figures
(longest cached prefix under the load bound max(1.25 x mean, mean + 2))
and the module's own core routing the simulated fleet (module_*, for
comparison with the real run) -- then the mock replicas start with the
profile's slots and cache, and replay.py replays the workload through each
policy, one after the other, caches and counters reset between runs.
Arrivals are the workload's times divided by the profile's rate
multiplier and by the replay speed, the mock's times by the speed: TTFTs
are in profile seconds, as the simulator's.  The speed is at most --speed
and low enough that requests are sent at most --max-wall-rate per second
(the client, nginx and the mock share this machine's cores).

Results go to build/bench/<name>/, beside the run's working files, or
with RECORD=1 in the environment to the committed bench/results/<name>/:
results.md, results.json and, with python3-matplotlib,
vs_oracle_<profile>.png; results.md and results.json begin with the
command, commit, module version and date of the run (bench/stamp.py).
Each figure is the median over the seeds with the min-max spread; ratios
to the oracle are taken per seed.
"""

import argparse
import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = REPO                  # for bench.sim, not this directory

from bench import stamp  # noqa: E402
from bench.sim import profiles, trace, workloads  # noqa: E402
from bench.sim.mock_backend import MockProcess  # noqa: E402

SIM = os.path.join(REPO, 'bench', 'sim')
PYTHON = sys.executable

ORACLE_REPLAY = 'oracle_replay'
PROXY_PORT = 19300
MOCK_BASE_PORT = 19301      # core_policy.BASE_PORT names peers after it

SESSION_ZONE = 'session_affinity zone=bench_sessions:16m;'
PREFIX_ZONE = 'prefix_affinity zone=bench_prefixes:32m;'
PREFIX_CACHE_ZONE = 'prefix_affinity cache={cache} zone=bench_prefixes:32m;'
# The engines are polled as often as the module allows: the replay runs
# its workload faster than real time.
METRICS_LINE = 'affinity_metrics interval=100ms timeout=1s;'
STATUS_PATH = '/affinity-status'    # each instance's, beside the replay's

# Each policy: (kind, label, balancer lines, hashes the session id).
# nginx policies go into an upstream block, HAProxy ones into a backend
# section.  A policy that hashes the session id has nothing to hash
# without one: it is not run with sessions off.
POLICIES = {
    'round_robin': ('nginx', 'nginx round robin', '', False),
    'least_conn': ('nginx', 'nginx least_conn', 'least_conn;', False),
    'hash_consistent': ('nginx', 'nginx hash $http_x_session_id consistent',
                        'hash $http_x_session_id consistent;', True),
    'haproxy_hdr': ('haproxy',
                    'HAProxy hdr(X-Session-ID) consistent, balance factor 125',
                    'balance hdr(X-Session-ID)\n'
                    '    hash-type consistent\n'
                    '    hash-balance-factor 125', True),
    'haproxy_body': ('haproxy',
                     'HAProxy hash of the first 4 KB of the body, '
                     'balance factor 125',
                     'option http-buffer-request\n'
                     '    balance hash req.body,bytes(0,4096)\n'
                     '    hash-type consistent\n'
                     '    hash-balance-factor 125', False),
    # The module as configured with no parameter but its zone: its
    # defaults must be the best general choice.
    'session_affinity': ('nginx', 'session_affinity; (this module)',
                         SESSION_ZONE, False),
    'prefix_affinity': ('nginx', 'prefix_affinity; (this module)',
                        PREFIX_ZONE, False),
    'session_prefix': ('nginx',
                       'session_affinity; prefix_affinity; (this module)',
                       SESSION_ZONE + '\n        ' + PREFIX_ZONE, False),
    # The module told the replicas' KV cache size, as their engines log it
    # ({cache}: the profile's tokens a replica).
    'prefix_cache': ('nginx', 'prefix_affinity cache=N; (this module)',
                     PREFIX_CACHE_ZONE, False),
    'session_prefix_cache': ('nginx',
                             'session_affinity; prefix_affinity cache=N; '
                             '(this module)',
                             SESSION_ZONE + '\n        ' + PREFIX_CACHE_ZONE,
                             False),
    # prefix_affinity's level schedules (make bench-levels)
    'prefix_default': ('nginx', 'prefix_affinity (defaults; this module)',
                       PREFIX_ZONE, False),
    'prefix_seeds': ('nginx',
                     'prefix_affinity lengths=100,500,1000 step=0 '
                     '(seed lengths only)',
                     'prefix_affinity lengths=100,500,1000 step=0 '
                     'zone=bench_prefixes:32m;', False),
    'prefix_coarse': ('nginx', 'prefix_affinity step=2048 growth=12',
                      'prefix_affinity step=2048 growth=12 '
                      'zone=bench_prefixes:32m;', False),
    'prefix_fine': ('nginx', 'prefix_affinity step=128 growth=3',
                    'prefix_affinity step=128 growth=3 '
                    'zone=bench_prefixes:32m;', False),
    'prefix_8k': ('nginx', 'prefix_affinity max=8k',
                  'prefix_affinity max=8k zone=bench_prefixes:32m;', False),
    'prefix_long': ('nginx', 'prefix_affinity max=128k',
                    'prefix_affinity max=128k zone=bench_prefixes:32m;',
                    False),
    # The offline oracle's choices, replayed live: nginx, without the
    # module, sends each request to the replica the oracle chose for it
    # (X-Bench-Replica), so that the oracle's TTFT is measured through the
    # same client, proxy and mock as the policies'.  Its routes do not
    # depend on the session ids: one run serves both modes.
    ORACLE_REPLAY: ('routed', "*oracle's choices, replayed through nginx*",
                    '', False),
}

# Several instances of the module (both directives) behind a spreader that
# sends each request to one of them at random: name -> (instances, store,
# metrics): whether they share what they learn through a Redis server
# (affinity_store), whether they count the engines' own load
# (affinity_metrics).  The *_cache ones are told the replicas' KV cache
# size (prefix_affinity cache=), as the fleet's engines log it.
INSTANCES = {'x1': (1, False, False), 'x1_metrics': (1, False, True),
             'x2': (2, False, False),
             'x2_shared': (2, True, True), 'x4': (4, False, False),
             'x4_shared': (4, True, True),
             'x2_store': (2, True, False), 'x4_store': (4, True, False),
             'x2_metrics': (2, False, True),
             'x1_cache': (1, False, False), 'x2_store_cache': (2, True, False),
             'x4_store_cache': (4, True, False),
             'x4_shared_one': (4, True, True),
             'x4_shared_client': (4, True, True)}
# A control: four instances run and poll the engines, but the spreader
# sends every request to the first one, which routes as one instance with
# the engines' figures does.  What its time to first token loses against
# x1_metrics is what running four instances costs the machine (their
# polls of the mock replicas, their workers, the store), not routing.
THROUGH_FIRST = ('x4_shared_one',)
# A spreader that sends every request of a session (a client) to the same
# instance, as a front that hashes the client's address or its session
# header does: a session's sibling requests then meet in one instance,
# which places them one after another.
BY_CLIENT = ('x4_shared_client',)
for _name, (_n, _store, _metrics) in INSTANCES.items():
    _how = ' + '.join(d for d, on in (('affinity_store', _store),
                                      ('affinity_metrics', _metrics)) if on)
    _cache = _name.endswith('_cache')
    POLICIES[_name] = (
        'nginx',
        f'session_affinity; prefix_affinity{" cache=N" if _cache else ""}; '
        f'x{_n} instances'
        + (f', {_how}' if _how else (', on their own' if _n > 1 else ''))
        + (', every request through the first'
           if _name in THROUGH_FIRST else '')
        + (', each client through one' if _name in BY_CLIENT else ''),
        SESSION_ZONE + '\n        '
        + (PREFIX_CACHE_ZONE if _cache else PREFIX_ZONE), False)
# x1_metrics: one instance reading the engines' figures, as the shared
# ones do (their load, their cache's size and what it computed).
INSTANCE_POLICIES = ['x1', 'x1_metrics', 'x2', 'x2_shared', 'x4',
                     'x4_shared']
REDIS_PORT = 19390

MAIN_POLICIES = ['session_prefix_cache', 'prefix_cache', 'session_prefix',
                 'session_affinity', 'prefix_affinity', 'round_robin',
                 'least_conn', 'hash_consistent', 'haproxy_hdr',
                 'haproxy_body', ORACLE_REPLAY]
QUICK_POLICIES = ['session_prefix_cache', 'session_prefix',
                  'prefix_affinity', 'hash_consistent', 'least_conn',
                  ORACLE_REPLAY]
# The comparison that chose prefix_affinity's default levels (README).
LEVEL_POLICIES = ['prefix_default', 'prefix_seeds', 'prefix_coarse',
                  'prefix_fine', 'prefix_8k', 'prefix_long']

# The simulator's policies run beside each real run: the oracle, and the
# module's core routing the simulated fleet, named after the real policy
# it stands for.
OFFLINE = {'oracle': None,
           'module_session_prefix_cache': 'session_prefix_cache',
           'module_prefix_cache': 'prefix_cache',
           'module_session_prefix': 'session_prefix',
           'module_session': 'session_affinity',
           'module_prefix': 'prefix_affinity'}

# The figures compared, from a replay summary and from a simulator one.
METRICS = ('hit_ratio', 'ttft_p50', 'ttft_p90', 'ttft_p99',
           'replica_ttft_p50', 'peak_inflight', 'moves_per_min',
           'moved_share_per_min')


def log(msg):
    print(msg, flush=True)


def wait_port(port, timeout=15):
    import socket
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f'nothing listens on port {port}')


# --- the fleet and the proxies ------------------------------------------------

def start_mock(workdir, profile, cache_tokens, speed):
    """The mock replicas, one process, one port each."""
    return MockProcess(
        [MOCK_BASE_PORT + i for i in range(profile.replicas)],
        '--max-running', profile.max_running,
        '--prefill-ms-per-token', profile.prefill_ms_per_token,
        '--decode-ms-per-token', profile.decode_ms_per_token,
        '--cache-tokens', cache_tokens,
        '--time-scale', 1.0 / speed,
        '--slowdowns', ','.join('%g' % f for f in profile.slowdowns()),
        log=os.path.join(workdir, 'mock.log'))


class Proxy:
    """nginx (with the module loaded) or HAProxy in front of the fleet."""

    def __init__(self, workdir, kind, lines, ports, module, nginx_bin,
                 port=PROXY_PORT, index=0):
        self.kind = kind
        self.port = port
        self.dir = os.path.join(workdir, 'proxy' if index == 0
                                else f'proxy-{index}')
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, 'tmp'))
        servers = ports

        if kind in ('nginx', 'routed'):
            conf = os.path.join(self.dir, 'nginx.conf')
            with open(conf, 'w') as f:
                f.write(self.nginx_conf(lines, servers, module,
                                        routed=kind == 'routed'))
            self.cmd = [nginx_bin, '-p', self.dir, '-c', conf,
                        '-g', 'daemon off;']
        else:
            conf = os.path.join(self.dir, 'haproxy.cfg')
            with open(conf, 'w') as f:
                f.write(self.haproxy_conf(lines, servers))
            self.cmd = ['haproxy', '-f', conf]

        log_path = os.path.join(self.dir, 'proxy.log')
        self.out = open(log_path, 'w')
        self.proc = subprocess.Popen(self.cmd, stdout=self.out,
                                     stderr=subprocess.STDOUT)
        try:
            wait_port(self.port)
        except RuntimeError:
            self.proc.kill()
            with open(log_path) as f:
                raise RuntimeError(f'{kind} did not start:\n{f.read()}')

    def nginx_conf(self, lines, servers, module, routed=False):
        d = self.dir
        if routed:
            # X-Bench-Replica: N names the Nth replica; an address in
            # proxy_pass needs no resolver.  A request without a route
            # fails (an empty address), so that a replay without routes
            # cannot pass for the oracle's.
            choices = '\n'.join(f'        {i} 127.0.0.1:{p};'
                                for i, p in enumerate(servers))
            upstream = f'''map $http_x_bench_replica $bench_replica {{
{choices}
    }}'''
            target = '$bench_replica'
        else:
            upstream = '\n'.join(f'        server 127.0.0.1:{p};'
                                 for p in servers)
            upstream = f'''upstream fleet {{
{upstream}
        {lines}
    }}'''
            target = 'fleet'
        # The oracle's replay runs nginx without the module.
        load = '' if routed else f'load_module {module};'
        status = '' if routed else f'''
        location = {STATUS_PATH} {{
            affinity_status;
        }}'''
        return f'''{load}
worker_processes 2;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 8192; }}

http {{
    access_log off;
    client_body_temp_path {d}/tmp;
    proxy_temp_path {d}/tmp;
    client_body_buffer_size 1m;
    client_max_body_size 16m;

    {upstream}

    server {{
        listen 127.0.0.1:{self.port} backlog=4096;
        location / {{
            proxy_pass http://{target};
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 900s;
        }}{status}
    }}
}}
'''

    def haproxy_conf(self, lines, servers):
        upstream = '\n'.join(f'    server r{i + 1} 127.0.0.1:{p}'
                             for i, p in enumerate(servers))
        # maxconn needs twice as many descriptors; stay under common limits
        return f'''global
    maxconn 8000

defaults
    mode http
    # stream SSE chunks as they come, as nginx does with proxy_buffering off
    option http-no-delay
    timeout connect 5s
    timeout client 900s
    timeout server 900s

frontend fe
    bind 127.0.0.1:{PROXY_PORT}
    default_backend fleet

backend fleet
    {lines}
{upstream}
'''

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT if self.kind != 'haproxy'
                              else signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


# --- one case: a profile, a workload, a seed ----------------------------------

class Case:
    """A profile, a workload and a seed: the simulator's document, and the
    replay options every policy's run shares."""

    def __init__(self, profile, workload, seed, args):
        self.profile = profile
        self.workload = workload
        self.seed = seed
        self.args = args
        self.key = f'{profile.name}/{workload}/{seed}'

    def workload_args(self):
        a = self.args
        out = ['--workload', self.workload, '--seed', str(self.seed),
               '--trace', a.trace]
        if self.workload == 'conversation' and a.limit is not None:
            if a.limit:
                out += ['--limit', str(a.limit),
                        '--start', str((self.seed - 1) * a.limit)]
            # --limit 0: the whole trace
        else:
            out += ['--size', a.size]
        if self.workload == 'conversation' and a.arrivals != 'trace':
            out += ['--arrivals', a.arrivals]
        return out

    def profile_args(self):
        p = self.profile
        return ['--profile', p.name,
                '--replicas', str(p.replicas),
                '--max-running', str(p.max_running),
                '--rate-multiplier', str(p.rate_multiplier),
                '--prefill-ms-per-token', str(p.prefill_ms_per_token),
                '--decode-ms-per-token', str(p.decode_ms_per_token)] + (
            ['--cache-share', str(p.cache_share)] if p.cache_share
            else ['--cache-tokens', str(p.cache_tokens)])

    def run_bounds(self, workdir, modes, offline):
        out = os.path.join(workdir, 'bounds.json')
        cmd = [PYTHON, os.path.join(SIM, 'bounds.py')] \
            + self.workload_args() + self.profile_args() + [
                '--sessions', 'both' if len(modes) == 2 else modes[0],
                '--policies', ','.join(offline), '--output', out]
        subprocess.run(cmd, check=True)
        with open(out) as f:
            self.bounds = json.load(f)
        self.cache_tokens = self.bounds['profile']['replica_cache_tokens']
        self.speed = self.choose_speed()
        return self.bounds

    def choose_speed(self):
        """At most --speed, and at most --max-wall-rate requests a wall
        second through the stack: the arrival rate, or what the slots can
        serve when the workload asks for more (the rest waits in the
        replicas' queues, which costs nothing)."""
        w = self.bounds['workload']
        rate = (w['rate_per_s'] or 1.0) * self.profile.rate_multiplier
        load = self.bounds['offered_load']['slots'] or 1.0
        speed = min(self.args.speed,
                    self.args.max_wall_rate / (rate / max(1.0, load)))
        return max(1.0, round(speed, 1))


class Redis:
    """A redis-server of its own for a run, empty, without persistence."""

    def __init__(self, workdir):
        self.log = open(os.path.join(workdir, 'redis.log'), 'w')
        self.proc = subprocess.Popen(
            ['redis-server', '--port', str(REDIS_PORT), '--bind',
             '127.0.0.1', '--save', '', '--appendonly', 'no'],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(REDIS_PORT)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def start_proxies(case, name, fleet, workdir):
    """The policy's balancers: one, or several instances (and the store
    they share).  Returns (proxies, redis or None)."""
    kind, label, lines, _ = POLICIES[name]
    args = case.args
    count, store, metrics = INSTANCES.get(name, (1, False, False))
    lines = lines.replace('{cache}', str(case.cache_tokens))
    if args.extra and kind == 'nginx':
        lines += '\n        ' + args.extra
    redis = Redis(workdir) if store else None
    if store:
        lines += f'\n        affinity_store 127.0.0.1:{REDIS_PORT};'
    if metrics:
        lines += f'\n        {METRICS_LINE}'
    proxies = []
    try:
        for i in range(count):
            proxies.append(Proxy(workdir, kind, lines, fleet.ports,
                                 args.module, args.nginx,
                                 port=PROXY_PORT + 10 * i, index=i))
    except Exception:
        for p in proxies:
            p.stop()
        if redis:
            redis.stop()
        raise
    return proxies, redis


def instance_balance(proxy):
    """The status' balance of the fleet upstream, {} if unreadable."""
    url = f'http://127.0.0.1:{proxy.port}{STATUS_PATH}'
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)['upstreams']['fleet']['balance']
    except (OSError, ValueError, KeyError):
        return {}


def run_policy(case, name, mode, fleet, workdir):
    """One replay through one policy; its figures (summary())."""
    args = case.args
    proxies, redis = start_proxies(case, name, fleet, workdir)
    out = os.path.join(workdir, f'{name}-{mode}.json')
    targets = proxies[:1] if name in THROUGH_FIRST else proxies
    urls = ','.join(f'http://127.0.0.1:{p.port}/v1/chat/completions'
                    for p in targets)
    cmd = [PYTHON, os.path.join(SIM, 'replay.py'),
           '--url', urls,
           '--speed', str(case.speed),
           '--rate-multiplier', str(case.profile.rate_multiplier),
           '--sessions', mode, '--stats-urls', ','.join(fleet.stats_urls()),
           '--timeout', str(args.timeout), '--label', name,
           '--spread', 'client' if name in BY_CLIENT else 'request',
           '--output', out] + case.workload_args()
    if name == ORACLE_REPLAY:
        routes = os.path.join(workdir, 'oracle-routes.json')
        with open(routes, 'w') as f:
            json.dump(case.bounds['oracle_routes'], f)
        cmd += ['--routes', routes]
    started = time.time()
    balances = []
    try:
        subprocess.run(cmd, check=True)
        if redis:
            balances = [instance_balance(p) for p in proxies]
    finally:
        for proxy in proxies:
            proxy.stop()
        if redis:
            redis.stop()
    with open(out) as f:
        s = json.load(f)['summary']
    # replay.py resets the replicas' counters before it starts, so the
    # peaks reported by the replicas cover this run only.
    row = {'hit_ratio': s['hit_ratio'],
           'ttft_p50': s['ttft_trace_s']['p50'],
           'ttft_p90': s['ttft_trace_s']['p90'],
           'ttft_p99': s['ttft_trace_s']['p99'],
           'replica_ttft_p50': s['replica_ttft_trace_s']['p50'],
           'peak_inflight': s['server_peak_inflight_max'],
           'moves_per_min': s['moves_per_min'],
           'moved_share_per_min': s['moved_session_share_per_min'],
           'requests': s['requests'], 'errors': s['errors'],
           'error_kinds': s['error_kinds'],
           'send_lag_p99': s['send_lag_wall_s']['p99'],
           'wall_s': round(time.time() - started, 1)}
    if balances:
        # what each instance presumed beside its unheard requests at the
        # end, and the lessons behind it (affinity_store)
        row['unheard_presumed'] = [b.get('unheard_presumed')
                                   for b in balances]
        row['unheard_learned'] = [b.get('unheard_learned') for b in balances]
    os.unlink(out)          # per-request records: large, and kept nowhere
    return row


def offline_row(summary):
    """A simulator summary's figures (bounds.py)."""
    if summary is None:
        return None
    t = summary['ttft_s']
    # The simulator has no client or proxy: its TTFT is the replicas' own.
    return {'hit_ratio': summary['hit_ratio'], 'ttft_p50': t['p50'],
            'ttft_p90': t['p90'], 'ttft_p99': t['p99'],
            'replica_ttft_p50': t['p50'],
            'peak_inflight': summary['peak_inflight_max'],
            'moves_per_min': summary['moves_per_min'],
            'moved_share_per_min': summary['moved_session_share_per_min'],
            'routes': summary.get('routes')}


def vs_oracle(row, oracle):
    """Ratios to the oracle of the same seed: hit ratio / oracle's, TTFT
    p50 / oracle's (the client's, and the replicas' own), peak in-flight -
    oracle's."""
    if row is None or oracle is None:
        return {}

    def div(a, b):
        return a / b if a is not None and b else None
    return {'hit_vs_oracle': div(row['hit_ratio'], oracle['hit_ratio']),
            'ttft_p50_vs_oracle': div(row['ttft_p50'], oracle['ttft_p50']),
            'replica_ttft_p50_vs_oracle': div(row.get('replica_ttft_p50'),
                                              oracle['ttft_p50']),
            'peak_minus_oracle':
                None if row['peak_inflight'] is None
                else row['peak_inflight'] - oracle['peak_inflight']}


def vs_replayed_oracle(row, replayed):
    """TTFT p50 over the replayed oracle's (ORACLE_REPLAY) of the same
    seed: both measured through the client, nginx and the mock, so that
    the time they add is on both sides."""
    a, b = row.get('ttft_p50'), replayed.get('ttft_p50')
    return {'ttft_p50_vs_replayed': a / b if a is not None and b else None}


# --- aggregation and reports ----------------------------------------------------

def spread(values):
    """(median, min, max) of the values that exist, or None."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return (statistics.median(values), min(values), max(values))


def aggregate(rows):
    """{figure: (median, min, max)} over the seeds' rows."""
    keys = list(METRICS) + ['hit_vs_oracle', 'ttft_p50_vs_oracle',
                            'replica_ttft_p50_vs_oracle',
                            'ttft_p50_vs_replayed',
                            'peak_minus_oracle', 'errors']
    return {k: spread([r.get(k) for r in rows]) for k in keys}


def cell(s, digits=3):
    if s is None:
        return '-'
    med, low, high = s
    text = f'{med:.{digits}f}'
    if high - low > 10 ** -digits / 2:
        text += f' ({low:.{digits}f}-{high:.{digits}f})'
    return text


def count_cell(s):
    if s is None:
        return '-'
    med, low, high = s
    text = '%g' % med
    if high != low:
        text += ' (%g-%g)' % (low, high)
    return text


def signed_cell(s, digits=0):
    if s is None:
        return '-'
    med, low, high = s
    # the median of an even number of seeds may fall between two counts
    places = digits if med == round(med, digits) else digits + 1
    text = f'{med:+.{places}f}'
    if high != low:
        text += f' ({low:+.{digits}f} to {high:+.{digits}f})'
    return text


TABLE_HEAD = ('| policy | hit ratio | ÷ oracle | TTFT p50 | ÷ oracle | '
              '÷ replayed oracle | at the replicas ÷ oracle | TTFT p90 | '
              'TTFT p99 | peak in-flight | − oracle | moved/min | '
              'moved share/min | errors |\n'
              '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:'
              '|---:|---:|')


def table_row(label, agg, offline=False):
    return (f"| {label} | {cell(agg['hit_ratio'])} |"
            f" {cell(agg['hit_vs_oracle'], 2)} |"
            f" {cell(agg['ttft_p50'], 2)} |"
            f" {cell(agg['ttft_p50_vs_oracle'], 2)} |"
            f" {cell(agg['ttft_p50_vs_replayed'], 2)} |"
            f" {cell(agg['replica_ttft_p50_vs_oracle'], 2)} |"
            f" {cell(agg['ttft_p90'], 2)} | {cell(agg['ttft_p99'], 2)} |"
            f" {count_cell(agg['peak_inflight'])} |"
            f" {signed_cell(agg['peak_minus_oracle'])} |"
            f" {cell(agg['moves_per_min'], 3)} |"
            f" {cell(agg['moved_share_per_min'], 3)} |"
            f" {'-' if offline else count_cell(agg['errors'])} |")


def describe_profile(p, cache_tokens):
    cache = ('%s of the distinct prompt blocks over the fleet'
             % f'{p.cache_share:g}' if p.cache_share
             else f'{p.cache_tokens} tokens')
    return (f'{p.replicas} replicas x {p.max_running} running slots, KV cache '
            f'{cache} ({cache_tokens}), arrivals at {p.rate_multiplier:g}x '
            f'the workload\'s rate')


def write_report(results, args, outdir, elapsed, stamped):
    """results.md and results.json, stamped; returns the markdown."""
    lines = [f'# {stamp.shown(outdir)}', '', stamp.markdown(stamped), '',
             'Each figure: the median over the seeds, with the min-max '
             'spread in parentheses when they differ; ratios to the oracle '
             'are taken seed by seed.  TTFT in profile seconds; peak '
             'in-flight: the most requests one replica held at once '
             '(running and waiting); moved/min: moves per active session '
             'per minute, moved share/min: the share of active sessions '
             'that changed replica in a minute (trace.session_moves).  '
             'TTFT at the replicas: as each mock replica measures it '
             '(X-Replica-TTFT), from the request\'s arrival to its first '
             'token, without the client\'s, nginx\'s and the '
             'connections\' time, which the replay multiplies by its speed '
             'with the rest (the mock\'s own timers, which share the '
             'cores, stay in it); the oracle\'s TTFT is also the '
             'replicas\'.  '
             '÷ replayed oracle: the client\'s TTFT p50 over that of the '
             'oracle\'s choices replayed through nginx (oracle_replay: '
             'each request sent to the replica the offline oracle chose '
             'for it), measured the same way: the time the client, nginx '
             'and the mock add is on both sides.  '
             'Rows in italics come from the offline simulator '
             '(bench/sim/bounds.py) on the same workload, profile and '
             'seed: the oracle (the longest cached prefix among replicas '
             'under the same load bound) and the module\'s own core '
             'routing the simulated fleet.  The oracle is greedy: when the '
             'fleet is overloaded (decode work above 1x the running slots), '
             'its bound spreads conversations and a policy that keeps them '
             'together beats it (÷ oracle above 1).', '',
             f'Seeds: {args.seeds}; policies: {", ".join(args.policy_list)};'
             f' total time {elapsed / 60:.1f} min.', '']
    summary = ['## Summary: the module\'s default configurations against '
               'the oracle', '',
               '| profile | workload | sessions | policy | hit ÷ oracle | '
               'TTFT p50 ÷ oracle | ÷ replayed oracle | '
               'at the replicas ÷ oracle | '
               'peak in-flight − oracle | moved/min (oracle) |',
               '|---|---|---|---|---:|---:|---:|---:|---:|---:|']
    detail = []
    for pname, by_workload in results.items():
        for wname, entry in by_workload.items():
            cases = entry['cases']
            profile = entry['profile']
            caches = sorted({c['cache_tokens'] for c in cases})
            loads = spread([c['offered_load']['slots'] for c in cases])
            reqs = spread([c['workload']['requests'] for c in cases])
            sess = spread([c['workload']['sessions'] for c in cases])
            speeds = sorted({c['speed'] for c in cases})
            detail += [f'## {pname}: {wname}', '',
                       f'{describe_profile(profile, ", ".join(map(str, caches)))}.'
                       f' Workload: {count_cell(reqs)} requests,'
                       f' {count_cell(sess)} sessions'
                       + (', each at a random moment of the trace\'s'
                          ' 3-second tick it came in'
                          if wname == 'conversation'
                          and args.arrivals == 'spread' else '')
                       + '; decode work'
                       f' {cell(loads, 2)} x the running slots while'
                       f' requests arrive; replayed'
                       f' {", ".join("%gx" % s for s in speeds)} faster'
                       f' (the client, nginx and the mock add a few ms of'
                       f' wall time a request: differences of the client\'s'
                       f' TTFT under {0.005 * max(speeds):.2f} s are'
                       f' noise).', '']
            for mode, by_policy in entry['modes'].items():
                detail += [f'### sessions {mode}', '', TABLE_HEAD]
                oracle = entry['offline'][mode].get('oracle')
                for name, rows in by_policy.items():
                    label = POLICIES[name][1]
                    if rows is None:
                        detail.append(f'| {label} | n/a: no session id to '
                                      'hash | | | | | | | | | | | | |')
                        continue
                    detail.append(table_row(label, aggregate(rows)))
                for name, rows in entry['offline'][mode].items():
                    if rows is None:
                        continue
                    label = ('*oracle (offline)*' if name == 'oracle'
                             else f'*{name} (offline, the core)*')
                    detail.append(table_row(label, aggregate(rows), True))
                detail.append('')
                for name in ('session_prefix_cache', 'prefix_cache',
                             'session_prefix', 'session_affinity',
                             'prefix_affinity'):
                    rows = by_policy.get(name)
                    if not rows:
                        continue
                    agg = aggregate(rows)
                    om = aggregate(oracle)['moves_per_min'] if oracle \
                        else None
                    summary.append(
                        f'| {pname} | {wname} | {mode} | {name} |'
                        f" {cell(agg['hit_vs_oracle'], 2)} |"
                        f" {cell(agg['ttft_p50_vs_oracle'], 2)} |"
                        f" {cell(agg['ttft_p50_vs_replayed'], 2)} |"
                        f" {cell(agg['replica_ttft_p50_vs_oracle'], 2)} |"
                        f" {signed_cell(agg['peak_minus_oracle'])} |"
                        f" {cell(agg['moves_per_min'], 3)}"
                        f" ({cell(om, 3)}) |")
    text = '\n'.join(lines + summary + [''] + detail) + '\n'
    with open(os.path.join(outdir, 'results.md'), 'w') as f:
        f.write(text)
    doc = {'stamp': stamped,
           'args': {k: v for k, v in vars(args).items()
                    if k not in ('module', 'nginx', 'trace')},
           'elapsed_s': round(elapsed, 1),
           'results': {p: {w: {k: v for k, v in e.items() if k != 'profile'}
                           | {'profile': e['profile'].describe()}
                           for w, e in by_w.items()}
                       for p, by_w in results.items()}}
    with open(os.path.join(outdir, 'results.json'), 'w') as f:
        json.dump(doc, f, indent=1)
    return text


def write_plots(results, outdir):
    """vs_oracle_<profile>.png: hit ratio and TTFT p50 of each policy over
    the oracle's, per workload and sessions mode."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        log('bench: matplotlib missing (python3-matplotlib); no plots')
        return
    for pname, by_workload in results.items():
        groups = []
        policies = []
        for wname, entry in by_workload.items():
            for mode, by_policy in entry['modes'].items():
                groups.append((f'{wname}\nsessions {mode}', by_policy))
                for name in by_policy:
                    if name not in policies:
                        policies.append(name)
        if not groups:
            continue
        fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(groups)),
                                                8))
        width = 0.8 / max(1, len(policies))
        for ax, key, title in (
                (axes[0], 'hit_vs_oracle', 'hit ratio / oracle\'s'),
                (axes[1], 'ttft_p50_vs_oracle', 'TTFT p50 / oracle\'s')):
            for k, name in enumerate(policies):
                xs, ys = [], []
                for i, (_, by_policy) in enumerate(groups):
                    rows = by_policy.get(name)
                    s = spread([r.get(key) for r in rows]) if rows else None
                    if s:
                        xs.append(i + k * width)
                        ys.append(s[0])
                ax.bar(xs, ys, width, label=name)
            ax.axhline(1.0, color='black', linewidth=0.8)
            ax.set_xticks([i + width * (len(policies) - 1) / 2
                           for i in range(len(groups))])
            ax.set_xticklabels([g for g, _ in groups], fontsize=8)
            ax.set_title(f'{pname}: {title} (median over seeds)')
        axes[0].legend(fontsize=8, ncol=3)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, f'vs_oracle_{pname}.png'), dpi=100)
        plt.close(fig)


# --- main -------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--quick', action='store_true',
                    help='tight, every workload but long-mix, both session '
                         'modes, 1 seed, quick slices, the quick policies')
    ap.add_argument('--instances', action='store_true',
                    help='tight, every workload, both session modes, 1 seed, '
                         'quick slices: 1, 2 and 4 instances of the module, '
                         'on their own and sharing a store')
    ap.add_argument('--levels', action='store_true',
                    help='roomy, the first 2000 requests of the trace, '
                         'prefix_affinity level variants')
    ap.add_argument('--profile', choices=('tight', 'mixed', 'roomy', 'both'))
    ap.add_argument('--workload', choices=workloads.NAMES + ('all',))
    ap.add_argument('--sessions', choices=('on', 'off', 'both'))
    ap.add_argument('--seeds', type=int,
                    help='generated workloads: seeds 1..N; conversation: '
                         'N slices (default 3, 1 with --quick)')
    ap.add_argument('--size', choices=('full', 'quick'),
                    help='workload size (default full, quick with --quick)')
    ap.add_argument('--limit', type=int,
                    help='conversation: slices of N requests (0: the whole '
                         'trace)')
    ap.add_argument('--trace', default=trace.DEFAULT_TRACE)
    ap.add_argument('--arrivals', choices=('trace', 'spread'),
                    help='conversation: the trace\'s timestamps, which come '
                         'in ticks of 3 s (default but with --instances), '
                         'or each request at a random moment of its tick')
    ap.add_argument('--policies', default='',
                    help='comma-separated, from: ' + ', '.join(POLICIES))
    ap.add_argument('--speed', type=float, default=20.0,
                    help='the most profile seconds per wall second '
                         '(default %(default)s)')
    ap.add_argument('--max-wall-rate', type=float, default=100.0,
                    help='requests served per wall second, at most '
                         '(default %(default)s)')
    ap.add_argument('--timeout', type=float, default=600.0,
                    help='seconds (wall) a request may take')
    ap.add_argument('--with', dest='extra', default='',
                    help='directives added to the upstream of every nginx '
                         'policy, e.g. "affinity_balance factor=2;"')
    ap.add_argument('--name', default='')
    for option, name, kind in profiles.OPTIONS:
        ap.add_argument(option, dest=name, type=kind,
                        help='overrides the profiles\' ' + name)
    ap.add_argument('--module', default=os.environ.get(
        'AFFINITY_MODULE',
        os.path.join(REPO, 'build', 'ngx_http_upstream_affinity_module.so')))
    ap.add_argument('--nginx', default=os.environ.get('NGINX_BIN',
                                                      '/usr/sbin/nginx'))
    args = ap.parse_args(argv)

    if args.levels:
        preset = dict(profile='roomy', workload='conversation',
                      sessions='on', seeds=1, limit=2000,
                      policies=','.join(LEVEL_POLICIES), name='levels')
    elif args.instances:
        # Instances behind a spreader place the requests that reach them
        # at once each without the others: the trace's ticks would send
        # up to 28 in the same millisecond, as production traffic does not.
        preset = dict(profile='tight', workload='all', sessions='both',
                      seeds=1, size='quick', arrivals='spread',
                      policies=','.join(INSTANCE_POLICIES), name='instances')
    elif args.quick:
        preset = dict(profile='tight', workload='all', sessions='both',
                      seeds=1, size='quick',
                      policies=','.join(QUICK_POLICIES), name='quick-tight')
    else:
        preset = dict(profile='both', workload='all', sessions='both',
                      seeds=3, size='full',
                      policies=','.join(MAIN_POLICIES), name='full')
    for key, value in preset.items():
        if getattr(args, key) in (None, ''):
            setattr(args, key, value)
    if args.size is None:
        args.size = 'full'
    if args.arrivals is None:
        args.arrivals = 'trace'
    args.policy_list = args.policies.split(',')
    for p in args.policy_list:
        if p not in POLICIES:
            ap.error(f'unknown policy {p}; known: {", ".join(POLICIES)}')
    return args


# Left out of --quick, which must take under 10 minutes on 2 cores, and of
# --instances: the long-prompt mix (the full run has it).
QUICK_LEFT_OUT = ('long-mix',)


def selected_profiles(args):
    names = ['tight', 'roomy'] if args.profile == 'both' else [args.profile]
    out = []
    for name in names:
        a = argparse.Namespace(profile=name, **{
            n: getattr(args, n) for _, n, _ in profiles.OPTIONS})
        out.append(profiles.from_args(a))
    return out


class Lock:
    """One benchmark at a time on this machine: they share its cores and
    ports."""

    def __init__(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path

    def __enter__(self):
        self.file = open(self.path, 'w')
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log('bench: another benchmark runs; waiting for it')
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.file.close()


def main(argv=None):
    args = parse_args(argv)
    stamped = stamp.stamp()
    outdir = stamp.results_path(args.name)
    workdir = os.path.join(REPO, 'build', 'bench', args.name)
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(workdir, exist_ok=True)
    names = list(workloads.NAMES) if args.workload == 'all' \
        else [args.workload]
    if (args.quick or args.instances) and args.workload == 'all':
        names = [n for n in names if n not in QUICK_LEFT_OUT]
    modes = ['on', 'off'] if args.sessions == 'both' else [args.sessions]
    with Lock(os.path.join(REPO, 'build', 'bench', '.lock')):
        started = time.time()
        results = {}
        for profile in selected_profiles(args):
            results[profile.name] = {}
            for wname in names:
                entry = {'profile': profile, 'cases': [],
                         'modes': {m: {p: [] for p in args.policy_list}
                                   for m in modes},
                         'offline': {m: {o: [] for o in OFFLINE}
                                     for m in modes}}
                results[profile.name][wname] = entry
                for seed in range(1, args.seeds + 1):
                    run_case(Case(profile, wname, seed, args), entry, modes,
                             workdir)
                    # a report after each case: a long run can be read
                    # before it ends
                    write_report(results, args, outdir,
                                 time.time() - started, stamped)
        elapsed = time.time() - started
    text = write_report(results, args, outdir, elapsed, stamped)
    write_plots(results, outdir)
    print()
    print(text)


def run_case(case, entry, modes, workdir):
    t0 = time.time()
    log(f'bench: {case.key}: offline simulation')
    bounds = case.run_bounds(workdir, modes, list(OFFLINE))
    by_sessions = bounds['by_sessions']
    oracles = {}
    for mode in modes:
        oracle = offline_row(by_sessions[mode].get('oracle'))
        oracles[mode] = oracle
        for name in OFFLINE:
            row = offline_row(by_sessions[mode].get(name))
            if row is not None:
                row.update(vs_oracle(row, oracle))
                entry['offline'][mode][name].append(row)
    log(f'bench: {case.key}: {bounds["workload"]["requests"]} requests, '
        f'cache {case.cache_tokens} tokens a replica, speed {case.speed}')
    fleet = start_mock(workdir, case.profile, case.cache_tokens, case.speed)
    runs = {}
    try:
        for mode in modes:
            for name in case.args.policy_list:
                rows = entry['modes'][mode]
                if POLICIES[name][3] and mode == 'off':
                    rows[name] = None
                    continue
                if name == ORACLE_REPLAY and runs.get(f'{modes[0]}/{name}'):
                    row = dict(runs[f'{modes[0]}/{name}'])
                else:
                    log(f'bench: {case.key}: sessions {mode}: {name}')
                    row = run_policy(case, name, mode, fleet, workdir)
                row.update(vs_oracle(row, oracles[mode]))
                row['seed'] = case.seed
                rows[name].append(row)
                runs[f'{mode}/{name}'] = row
    finally:
        fleet.stop()
    replayed = runs.get(f'{modes[0]}/{ORACLE_REPLAY}')
    if replayed:
        for row in runs.values():
            row.update(vs_replayed_oracle(row, replayed))
    entry['cases'].append({
        'seed': case.seed, 'speed': case.speed,
        'cache_tokens': case.cache_tokens,
        'workload': bounds['workload'],
        'offered_load': bounds['offered_load'],
        'infinite_cache_hit_ratio': bounds['infinite_cache_hit_ratio'],
        'distinct_blocks': bounds['profile']['distinct_blocks'],
        'wall_s': round(time.time() - t0, 1)})


if __name__ == '__main__':
    main()
