#!/usr/bin/env python3
"""The shared store killed and restored under load: what two nginx
instances sharing it (affinity_store) lose, and how fast they agree again.

Two nginx instances (2 workers each) in front of the same 4 backends
(backend.py) share a redis-server.  Instance A has three of the backends
`down`, so every session it pins goes to the first; instance B has all four
up, so a session it has not heard of goes where its ring says (three times
in four elsewhere).  A steady load of keyed requests goes to both at
random; every --probe-every seconds a new session is opened on A, and asked
for once on B after a delay: B sends it to the first backend only if it
learned A's pin through the store.  A session is asked for on B only once,
since B's own answer pins it there too.

    phase      seconds (defaults)
    before     --before 10      the store up: how fast a pin reaches B
    outage     --outage 10      redis-server killed (SIGKILL)
    after      --after 15       redis-server restarted, empty: how long
                                until what A learned meanwhile reaches B

Figures, per run: requests and failures (any answer but 200, or none) per
phase, client latency p50/p99 per phase, the share of sessions B routed by
A's pin by the delay after it was set (store up) or after the store was
back (sessions pinned during the outage), and the probes' own failed
requests.  --runs N repeats the
whole run (each with fresh processes); results go to
bench/results/<--name>/ (results.json, results.md).

    bench/faults/store_outage.py [--runs 3] [--rate 200] [--name store-outage]

Environment: NGINX_BIN (/usr/sbin/nginx), AFFINITY_MODULE
(build/ngx_http_upstream_affinity_module.so).
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)

import run       # noqa: E402  (free_ports, wait_port, pdeathsig, log)
from bench.sim import core_policy, http1     # noqa: E402

NBACKENDS = 4
WORKERS = 2
# Delays after which a session is asked for on B: after its pin on A with
# the store up, after the store's restart for those pinned without it.
UP_DELAYS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5)
BACK_DELAYS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)


def nginx_conf(d, module, port, backends, redis, down):
    servers = '\n'.join(
        '        server 127.0.0.1:%d%s;' % (p, ' down' if i in down else '')
        for i, p in enumerate(backends))
    return f'''# written by bench/faults/store_outage.py
load_module {module};
worker_processes {WORKERS};
error_log {d}/error.log notice;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}

http {{
    access_log off;
    client_body_temp_path {d}/tmp;
    proxy_temp_path {d}/tmp;

    upstream fleet {{
{servers}
        session_affinity zone=outage_sessions:8m;
        affinity_store 127.0.0.1:{redis} stream=outage;
    }}

    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            add_header X-Route $affinity_route always;
        }}
    }}
}}
'''


class Processes:
    """The backends, redis-server and the two nginx instances of a run."""

    def __init__(self, workdir, nginx, module):
        self.dir = workdir
        self.nginx_bin = nginx
        self.module = module
        ports = run.free_ports(NBACKENDS + 3)
        self.backend_ports = ports[:NBACKENDS]
        self.redis_port = ports[NBACKENDS]
        self.ports = {'A': ports[NBACKENDS + 1], 'B': ports[NBACKENDS + 2]}
        self.procs = []
        self.redis = None
        self.logs = []

    def spawn(self, cmd, name, sig=signal.SIGKILL):
        out = open(os.path.join(self.dir, name + '.log'), 'a')
        self.logs.append(out)
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=run.pdeathsig(sig))
        return p

    def start(self):
        for i, port in enumerate(self.backend_ports):
            p = self.spawn([sys.executable, os.path.join(HERE, 'backend.py'),
                            '--port', str(port), '--name', 'b%d' % (i + 1)],
                           'backend-%d' % (i + 1))
            self.procs.append(p)
            run.wait_port(port, 10, p)
        self.start_redis()
        for name, down in (('A', (1, 2, 3)), ('B', ())):
            d = os.path.join(self.dir, name)
            os.makedirs(os.path.join(d, 'tmp'), exist_ok=True)
            with open(os.path.join(d, 'nginx.conf'), 'w') as f:
                f.write(nginx_conf(d, self.module, self.ports[name],
                                   self.backend_ports, self.redis_port,
                                   down))
            p = self.spawn([self.nginx_bin, '-p', d, '-c',
                            os.path.join(d, 'nginx.conf'),
                            '-g', 'daemon off;'], 'nginx-' + name,
                           signal.SIGTERM)
            self.procs.append(p)
            run.wait_port(self.ports[name], 15, p)

    def start_redis(self):
        self.redis = self.spawn(['redis-server', '--port',
                                 str(self.redis_port), '--bind', '127.0.0.1',
                                 '--save', '', '--appendonly', 'no'],
                                'redis')
        run.wait_port(self.redis_port, 10, self.redis)

    def kill_redis(self):
        self.redis.kill()
        self.redis.wait()
        self.redis = None

    def stop(self):
        for p in reversed(self.procs + ([self.redis] if self.redis else [])):
            if p.poll() is None:
                p.send_signal(signal.SIGQUIT if 'nginx' in str(p.args[0])
                              else signal.SIGTERM)
        for p in self.procs + ([self.redis] if self.redis else []):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()


async def request(port, session, timeout=5.0):
    """(status or None, the backend that answered or None, seconds,
    $affinity_route or None)."""
    head = ('POST /v1/chat/completions HTTP/1.1\r\nHost: outage\r\n'
            'Content-Type: application/json\r\nX-Session-ID: %s\r\n'
            'Content-Length: %d\r\nConnection: close\r\n\r\n')
    body = json.dumps({'model': 'm', 'messages': [
        {'role': 'user', 'content': 'hello from ' + session}]}).encode()
    started = time.monotonic()
    resp = http1.Response()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection('127.0.0.1', port), timeout)
        try:
            writer.write((head % (session, len(body))).encode() + body)
            await asyncio.wait_for(http1.read_response(reader, resp),
                                   timeout)
        finally:
            writer.close()
    except (OSError, asyncio.TimeoutError, http1.HttpError,
            asyncio.IncompleteReadError):
        return None, None, time.monotonic() - started, None
    headers = {k.lower(): v for k, v in resp.headers.items()}
    return (resp.status, headers.get('x-backend'),
            time.monotonic() - started, headers.get('x-route'))


class Run:
    def __init__(self, procs, args, rng):
        self.p = procs
        self.args = args
        self.rng = rng
        self.t0 = None
        self.events = {}
        self.load = []          # (t, status, seconds)
        self.probes = []        # (kind, delay, routed as pinned)
        self.ring = core_policy.Ring(core_policy.library(),
                                     ['127.0.0.1:%d' % port
                                      for port in procs.backend_ports])
        self.names = 0
        self.failed_probes = 0

    def now(self):
        return time.monotonic() - self.t0

    def phase(self, t):
        e = self.events
        if t < e['kill']:
            return 'before'
        if t < e['restart']:
            return 'outage'
        return 'after'

    async def steady_load(self, stop):
        """--rate requests a second, keyed, to A or B at random."""
        interval = 1.0 / self.args.rate
        pool = ['load-%d' % i for i in range(2000)]
        tasks = set()
        k = 0
        while not stop.is_set():
            target = self.p.ports[self.rng.choice('AB')]
            session = self.rng.choice(pool)

            async def one(target=target, session=session):
                t = self.now()
                status, _, seconds, _ = await request(target, session)
                self.load.append((t, status, seconds))
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
            await asyncio.sleep(max(0.0, self.t0 + k * interval
                                    - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)

    async def probe(self, session, delay, kind, after_restart=False):
        """Pin session on A now; ask B once, delay seconds after the pin,
        or delay to delay + 0.1 s after the store is back (at random: the
        probes of one delay reaching B at once would pass the load bound
        and spill).  B knew the pin if it routed the request by it: to its
        pinned peer, or spilled from it."""
        status, backend, _, _ = await request(self.p.ports['A'], session)
        if status != 200:
            self.failed_probes += 1
        if status != 200 or backend != 'b1':
            return
        if after_restart:
            while 'restart' not in self.events:
                await asyncio.sleep(0.01)
            when = self.t0 + self.events['restart'] + delay \
                + self.rng.random() * 0.1
        else:
            when = time.monotonic() + delay
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        status, backend, _, route = await request(self.p.ports['B'],
                                                   session)
        if status != 200:
            self.failed_probes += 1
        else:
            self.probes.append((kind, delay, route in ('session_hit',
                                                       'session_spill'),
                                backend == 'b1'))

    def probe_name(self, kind):
        """A session B's ring places elsewhere than the first backend:
        B sends it there only if it learned A's pin."""
        while True:
            self.names += 1
            name = '%s-%d' % (kind, self.names)
            if self.ring.first(name) != 0:
                return name

    async def probes_loop(self, stop):
        k = 0
        tasks = []
        while not stop.is_set():
            t = self.now()
            k += 1
            if t < self.events.get('kill', float('inf')) - 1.0:
                delay = UP_DELAYS[k % len(UP_DELAYS)]
                tasks.append(asyncio.ensure_future(
                    self.probe(self.probe_name('up'), delay, 'up')))
            elif 'kill' in self.events and 'restart' not in self.events \
                    and t > self.events['kill'] + 2.5:
                # pinned while the store is away (its absence noticed)
                delay = BACK_DELAYS[k % len(BACK_DELAYS)]
                tasks.append(asyncio.ensure_future(
                    self.probe(self.probe_name('outage'), delay, 'back',
                               after_restart=True)))
            await asyncio.sleep(self.args.probe_every)
        await asyncio.gather(*tasks)

    async def main(self):
        a = self.args
        self.t0 = time.monotonic()
        self.events = {}
        stop = asyncio.Event()
        jobs = [asyncio.ensure_future(self.steady_load(stop)),
                asyncio.ensure_future(self.probes_loop(stop))]
        await asyncio.sleep(a.before)
        self.events['kill'] = self.now()
        self.p.kill_redis()
        await asyncio.sleep(a.outage)
        self.p.start_redis()
        self.events['restart'] = self.now()     # listening again
        await asyncio.sleep(a.after)
        stop.set()
        await asyncio.gather(*jobs)
        self.events['end'] = self.now()

    def figures(self):
        out = {'events': {k: round(v, 3) for k, v in self.events.items()}}
        phases = {}
        for name in ('before', 'outage', 'after'):
            rows = [r for r in self.load if self.phase(r[0]) == name]
            ok = [s for _, st, s in rows if st == 200]
            phases[name] = {
                'requests': len(rows),
                'failed': sum(1 for r in rows if r[1] != 200),
                'latency_p50_ms': round(1000 * statistics.median(ok), 2)
                if ok else None,
                'latency_p99_ms': round(1000 * sorted(ok)[
                    int(0.99 * (len(ok) - 1))], 2) if ok else None}
        out['phases'] = phases
        share = {}
        for kind in ('up', 'back'):
            by_delay = {}
            for k, delay, knew, there in self.probes:
                if k == kind:
                    by_delay.setdefault(delay, []).append((knew, there))
            # [knew the pin, routed to the pinned peer, asked]
            share[kind] = {str(d): [sum(k for k, _ in v),
                                    sum(t for _, t in v), len(v)]
                           for d, v in sorted(by_delay.items())}
        out['knew_the_pin'] = share
        out['failed_probes'] = self.failed_probes
        return out


def report(doc):
    runs = doc['runs']
    lines = ['# ' + doc['name'], '',
             'bench/faults/store_outage.py: two nginx instances (2 workers '
             'each) sharing a redis-server in front of 4 backends; %d '
             'keyed requests a second to either at random; the store '
             'killed after %g s, restarted empty %g s later, the run going '
             'on %g s more.  %d runs.' % (doc['rate'], doc['before'],
                                          doc['outage'], doc['after'],
                                          len(runs)), '',
             '| phase | requests | failed | latency p50 / p99 (ms) |',
             '|---|---:|---:|---:|']
    for name in ('before', 'outage', 'after'):
        req = [r['phases'][name]['requests'] for r in runs]
        failed = [r['phases'][name]['failed'] for r in runs]
        p50 = [r['phases'][name]['latency_p50_ms'] for r in runs]
        p99 = [r['phases'][name]['latency_p99_ms'] for r in runs]
        lines.append('| %s | %s | %s | %s / %s |' % (
            name, ' + '.join(map(str, req)), ' + '.join(map(str, failed)),
            ', '.join('%.1f' % v for v in p50),
            ', '.join('%.1f' % v for v in p99)))
    for kind, title in (('up', 'after its pin on A, the store up'),
                        ('back', 'after the store restarted, for sessions '
                                 'pinned on A while it was away')):
        lines += ['', 'Sessions pinned on A that B routed by that pin '
                  '(`$affinity_route` session_hit or session_spill), and '
                  'of them to the pinned backend, by the delay %s (all '
                  'runs):' % title, '',
                  '| delay (s) | knew the pin | sent there |',
                  '|---:|---:|---:|']
        total = {}
        for r in runs:
            for d, (knew, there, n) in r['knew_the_pin'][kind].items():
                k, t, m = total.get(d, (0, 0, 0))
                total[d] = (k + knew, t + there, m + n)
        for d in sorted(total, key=float):
            k, t, n = total[d]
            lines.append('| %s | %d of %d | %d |' % (d, k, n, t))
    lines += ['', 'Probe requests that failed: %s.' % ' + '.join(
        str(r['failed_probes']) for r in runs)]
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=3)
    p.add_argument('--rate', type=float, default=200.0,
                   help='requests a second (default %(default)s)')
    p.add_argument('--before', type=float, default=10.0)
    p.add_argument('--outage', type=float, default=10.0)
    p.add_argument('--after', type=float, default=15.0)
    p.add_argument('--probe-every', type=float, default=0.05)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--name', default='store-outage')
    p.add_argument('--keep', action='store_true',
                   help='keep each run\'s work directory (logs)')
    p.add_argument('--nginx', default=os.environ.get('NGINX_BIN',
                                                     '/usr/sbin/nginx'))
    p.add_argument('--module', default=os.environ.get(
        'AFFINITY_MODULE', os.path.join(
            REPO, 'build', 'ngx_http_upstream_affinity_module.so')))
    args = p.parse_args(argv)
    if not shutil.which('redis-server'):
        p.error('redis-server is not installed')
    module = os.path.abspath(args.module)
    runs = []
    for i in range(args.runs):
        workdir = tempfile.mkdtemp(prefix='store-outage-')
        procs = Processes(workdir, args.nginx, module)
        try:
            procs.start()
            time.sleep(1.0)         # the workers connect to the store
            r = Run(procs, args, random.Random(args.seed + i))
            asyncio.run(r.main())
            runs.append(r.figures())
            run.log('run %d: %s' % (i + 1, json.dumps(runs[-1]['phases'])))
        finally:
            procs.stop()
            if args.keep:
                run.log('run %d: work directory %s' % (i + 1, workdir))
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    doc = {'name': args.name, 'rate': args.rate, 'before': args.before,
           'outage': args.outage, 'after': args.after, 'runs': runs}
    outdir = os.path.join(REPO, 'bench', 'results', args.name)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, 'results.json'), 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    text = report(doc)
    with open(os.path.join(outdir, 'results.md'), 'w') as f:
        f.write(text)
    sys.stdout.write(text)
    failed = sum(r['phases'][k]['failed'] for r in runs for k in r['phases'])
    failed += sum(r['failed_probes'] for r in runs)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
