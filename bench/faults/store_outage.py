#!/usr/bin/env python3
"""The shared store faulted under load: what two nginx instances sharing
it (affinity_store) lose, and how fast they agree again.

Two nginx instances (2 workers each) in front of the same 4 backends
(backend.py) share a redis-server, with a secret.  Instance A has three of
the backends `down`, so every session it pins goes to the first; instance B
has all four up, so a session it has not heard of goes where its ring says
(three times in four elsewhere).  A steady load of keyed and unkeyed
requests goes to both at random; every --probe-every seconds a new session
is opened on A, and asked for once on B after a delay: B sends it to the
first backend only if it learned A's pin through the store.  A session is
asked for on B only once, since B's own answer pins it there too.

The store's faults, one after the other (--faults), each --outage seconds,
--after seconds apart, after --before seconds of the store up:

    kill      redis-server killed (SIGKILL), then started again empty
    stall     redis-server stopped (SIGSTOP) without closing, then continued
    demote    made a replica of a master that is not there (it refuses
              writes, still answers reads), then promoted again
    junk      replaced by a fake store that answers commands with random
              bytes (t/fake-store.pl), then by redis-server again, empty

Figures, per run: requests and failures (any answer but 200, or none) per
phase, client latency p50/p99 per phase; worker crashes (nginx's "exited
on signal"); the share of sessions B routed by A's pin by the delay after
it was set (store up) or after the fault ended (sessions pinned during
it): those never routed by it, at the longest delays, are lost; and the
probes' own failed requests.  --runs N repeats the whole run (each with
fresh processes); results go to build/bench/<--name>/, or to the
committed bench/results/<--name>/ with --record or RECORD=1 in the
environment (results.json, results.md; bench/stamp.py), each beginning
with the run's command line, commit, module version and date.

    bench/faults/store_outage.py [--runs 3] [--rate 200] [--faults ...]

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
import socket
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
from bench import stamp                      # noqa: E402
from bench.sim import core_policy, http1     # noqa: E402

NBACKENDS = 4
WORKERS = 2
# Delays after which a session is asked for on B: after its pin on A with
# the store up, after the fault's end for those pinned during it.
UP_DELAYS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5)
BACK_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0)
# A session not routed by its pin this long after the fault ended is lost.
LOST_AFTER = 8.0
FAULTS = ('kill', 'stall', 'demote', 'junk')
SECRET = 'the store-faults benchmark secret'


def nginx_conf(d, module, port, backends, redis, down, secret):
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
        prefix_affinity zone=outage_prefixes:8m;
        affinity_store 127.0.0.1:{redis} stream=outage secret={secret};
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
    """The backends, the store and the two nginx instances of a run."""

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
        self.fake = None
        self.logs = []
        self.secret = os.path.join(workdir, 'secret')
        with open(self.secret, 'w') as f:
            f.write(SECRET + '\n')
        os.chmod(self.secret, 0o600)

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
                                   down, self.secret))
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

    def redis_command(self, *args):
        """A command to the store: the first line of its reply."""
        with socket.create_connection(('127.0.0.1', self.redis_port),
                                      5) as s:
            s.sendall(('*%d\r\n' % len(args) + ''.join(
                '$%d\r\n%s\r\n' % (len(a), a) for a in args)).encode())
            return s.recv(4096).split(b'\r\n')[0].decode()

    def start_fault(self, fault):
        if fault == 'kill':
            self.kill_redis()
        elif fault == 'stall':
            self.redis.send_signal(signal.SIGSTOP)
        elif fault == 'demote':
            nowhere = run.free_ports(1)[0]
            self.redis_command('REPLICAOF', '127.0.0.1', str(nowhere))
        else:
            self.kill_redis()
            self.fake = self.spawn([
                'perl', os.path.join(REPO, 't', 'fake-store.pl'), '--port',
                str(self.redis_port), '--mode', 'junk', '--log',
                os.path.join(self.dir, 'fake-store.conns')], 'fake-store')
            run.wait_port(self.redis_port, 10, self.fake)

    def end_fault(self, fault):
        if fault == 'kill':
            self.start_redis()
        elif fault == 'stall':
            self.redis.send_signal(signal.SIGCONT)
        elif fault == 'demote':
            self.redis_command('REPLICAOF', 'NO', 'ONE')
        else:
            self.fake.kill()
            self.fake.wait()
            self.fake = None
            self.start_redis()

    def crashes(self):
        """The lines of the instances' error logs on workers that crashed."""
        lines = []
        for name in ('A', 'B'):
            with open(os.path.join(self.dir, name, 'error.log'),
                      errors='replace') as f:
                lines += [line.strip() for line in f
                          if 'exited on signal' in line]
        return lines

    def stop(self):
        if self.redis and self.redis.poll() is None:
            self.redis.send_signal(signal.SIGCONT)
        others = [p for p in (self.redis, self.fake) if p]
        for p in reversed(self.procs + others):
            if p.poll() is None:
                p.send_signal(signal.SIGQUIT if 'nginx' in str(p.args[0])
                              else signal.SIGTERM)
        for p in self.procs + others:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()


async def request(port, session, timeout=5.0, keyed=True):
    """(status or None, the backend that answered or None, seconds,
    $affinity_route or None).  Unkeyed, the session names the prompt."""
    head = ('POST /v1/chat/completions HTTP/1.1\r\nHost: outage\r\n'
            'Content-Type: application/json\r\n%s'
            'Content-Length: %d\r\nConnection: close\r\n\r\n')
    body = json.dumps({'model': 'm', 'messages': [
        {'role': 'system', 'content': 'You answer questions. ' * 10},
        {'role': 'user', 'content': 'hello from ' + session}]}).encode()
    key = 'X-Session-ID: %s\r\n' % session if keyed else ''
    started = time.monotonic()
    resp = http1.Response()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection('127.0.0.1', port), timeout)
        try:
            writer.write((head % (key, len(body))).encode() + body)
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
        self.events = []        # [fault, start, end]
        self.load = []          # (t, status, seconds)
        self.probes = []        # (kind, delay, routed as pinned, there)
        self.ring = core_policy.Ring(core_policy.library(),
                                     ['127.0.0.1:%d' % port
                                      for port in procs.backend_ports])
        self.names = 0
        self.failed_probes = 0

    def now(self):
        return time.monotonic() - self.t0

    def phase(self, t):
        """'before', a fault's name while it lasts, '<fault> after' from
        its end to the next one."""
        name = 'before'
        for fault, start, end in self.events:
            if t >= start:
                name = fault if end is None or t < end else fault + ' after'
        return name

    def phases(self):
        names = ['before']
        for fault in self.args.faults:
            names += [fault, fault + ' after']
        return names

    async def steady_load(self, stop):
        """--rate requests a second, to A or B at random, keyed three times
        in four."""
        interval = 1.0 / self.args.rate
        pool = ['load-%d' % i for i in range(2000)]
        tasks = set()
        k = 0
        while not stop.is_set():
            target = self.p.ports[self.rng.choice('AB')]
            session = self.rng.choice(pool)
            keyed = self.rng.random() < 0.75

            async def one(target=target, session=session, keyed=keyed):
                t = self.now()
                status, _, seconds, _ = await request(target, session,
                                                      keyed=keyed)
                self.load.append((t, status, seconds))
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1
            await asyncio.sleep(max(0.0, self.t0 + k * interval
                                    - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)

    async def probe(self, session, delay, kind, fault=None):
        """Pin session on A now; ask B once, delay seconds after the pin,
        or delay to delay + 0.1 s after the fault ended (at random: the
        probes of one delay reaching B at once would pass the load bound
        and spill).  B knew the pin if it routed the request by it: to its
        pinned peer, or spilled from it."""
        status, backend, _, _ = await request(self.p.ports['A'], session)
        if status != 200:
            self.failed_probes += 1
        if status != 200 or backend != 'b1':
            return
        if fault is not None:
            while self.events[fault][2] is None:
                await asyncio.sleep(0.01)
            when = self.t0 + self.events[fault][2] + delay \
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
            current = self.events[-1] if self.events else None
            if current is None or current[2] is not None:
                # the store up: before the first fault, or 1 s after one
                # ended until 1 s before the next
                if current is None or (t > current[2] + 1.0
                                       and t < current[2]
                                       + self.args.after - 1.0):
                    delay = UP_DELAYS[k % len(UP_DELAYS)]
                    tasks.append(asyncio.ensure_future(
                        self.probe(self.probe_name('up'), delay, 'up')))
            elif t > current[1] + 2.5:
                # pinned during the fault, its effect noticed
                delay = BACK_DELAYS[k % len(BACK_DELAYS)]
                tasks.append(asyncio.ensure_future(
                    self.probe(self.probe_name(current[0]), delay,
                               current[0], len(self.events) - 1)))
            await asyncio.sleep(self.args.probe_every)
        await asyncio.gather(*tasks)

    async def main(self):
        a = self.args
        self.t0 = time.monotonic()
        stop = asyncio.Event()
        jobs = [asyncio.ensure_future(self.steady_load(stop)),
                asyncio.ensure_future(self.probes_loop(stop))]
        await asyncio.sleep(a.before)
        for fault in a.faults:
            self.events.append([fault, self.now(), None])
            self.p.start_fault(fault)
            await asyncio.sleep(a.outage)
            self.p.end_fault(fault)
            self.events[-1][2] = self.now()
            await asyncio.sleep(a.after)
        stop.set()
        await asyncio.gather(*jobs)

    def figures(self):
        out = {'events': [[f, round(s, 3), round(e, 3)]
                          for f, s, e in self.events]}
        phases = {}
        for name in self.phases():
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
        for kind in ('up',) + tuple(self.args.faults):
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
        out['crashes'] = self.p.crashes()
        return out


def report(doc):
    runs = doc['runs']
    delays = sorted(set(UP_DELAYS + BACK_DELAYS))
    lines = ['# ' + doc['name'], '', stamp.markdown(doc['stamp']), '',
             'bench/faults/store_outage.py: two nginx instances (2 workers '
             'each) sharing a redis-server in front of 4 backends; %d '
             'requests a second to either at random (three in four keyed); '
             'after %g s of the store up, each fault for %g s, %g s apart: '
             '%s.  %d runs.'
             % (doc['rate'], doc['before'], doc['outage'], doc['after'],
                ', '.join(doc['faults']), len(runs)), '',
             '| phase | requests | failed | latency p50 / p99 (ms) |',
             '|---|---:|---:|---:|']
    for name in runs[0]['phases']:
        req = [r['phases'][name]['requests'] for r in runs]
        failed = [r['phases'][name]['failed'] for r in runs]
        p50 = [r['phases'][name]['latency_p50_ms'] or 0 for r in runs]
        p99 = [r['phases'][name]['latency_p99_ms'] or 0 for r in runs]
        lines.append('| %s | %s | %s | %s / %s |' % (
            name, ' + '.join(map(str, req)), ' + '.join(map(str, failed)),
            ', '.join('%.1f' % v for v in p50),
            ', '.join('%.1f' % v for v in p99)))
    lines += ['', 'Worker crashes: %s.  Probe requests that failed: %s.' % (
        ' + '.join(str(len(r['crashes'])) for r in runs),
        ' + '.join(str(r['failed_probes']) for r in runs))]
    lines += ['', 'Sessions pinned on A that B routed by that pin '
              '(`$affinity_route` session_hit or session_spill), of those '
              'asked, by the delay after the pin with the store up, or '
              'after the fault ended for those pinned during it (all '
              'runs).  Lost: not routed by the pin %g s or more after the '
              'fault ended.' % LOST_AFTER, '',
              '| pinned | ' + ' | '.join('%g s' % d for d in delays)
              + ' | lost |',
              '|---|' + '---:|' * (len(delays) + 1)]
    for kind in ['up'] + list(doc['faults']):
        total = {}
        for r in runs:
            for d, (knew, there, n) in r['knew_the_pin'][kind].items():
                k, t, m = total.get(float(d), (0, 0, 0))
                total[float(d)] = (k + knew, t + there, m + n)
        cells = []
        for d in delays:
            k, _, n = total.get(d, (0, 0, 0))
            cells.append('%d/%d' % (k, n) if n else '')
        lost = sum(n - k for d, (k, _, n) in total.items()
                   if d >= LOST_AFTER)
        lines.append('| %s | %s | %s |' % (
            'store up' if kind == 'up' else 'during ' + kind,
            ' | '.join(cells), '' if kind == 'up' else lost))
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--runs', type=int, default=3)
    p.add_argument('--rate', type=float, default=200.0,
                   help='requests a second (default %(default)s)')
    p.add_argument('--before', type=float, default=15.0)
    p.add_argument('--outage', type=float, default=15.0)
    p.add_argument('--after', type=float, default=20.0)
    p.add_argument('--faults', default=','.join(FAULTS),
                   help='comma-separated, from: ' + ', '.join(FAULTS))
    p.add_argument('--probe-every', type=float, default=0.05)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--name', default='store-faults')
    p.add_argument('--record', action='store_true',
                   help='write to bench/results/<name>/ (a committed '
                        'result), not build/bench/<name>/ (RECORD=1 '
                        'does the same)')
    p.add_argument('--keep', action='store_true',
                   help='keep each run\'s work directory (logs)')
    p.add_argument('--nginx', default=os.environ.get('NGINX_BIN',
                                                     '/usr/sbin/nginx'))
    p.add_argument('--module', default=os.environ.get(
        'AFFINITY_MODULE', os.path.join(
            REPO, 'build', 'ngx_http_upstream_affinity_module.so')))
    args = p.parse_args(argv)
    stamped = stamp.stamp(program=__file__, argv=argv)
    args.faults = [f for f in args.faults.split(',') if f]
    for f in args.faults:
        if f not in FAULTS:
            p.error('unknown fault %r' % f)
    if not shutil.which('redis-server'):
        p.error('redis-server is not installed')
    module = os.path.abspath(args.module)
    runs = []
    for i in range(args.runs):
        workdir = tempfile.mkdtemp(prefix='store-faults-')
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
    doc = {'stamp': stamped, 'name': args.name, 'rate': args.rate,
           'before': args.before, 'outage': args.outage,
           'after': args.after, 'faults': args.faults, 'runs': runs}
    if args.record:
        outdir = os.path.join(REPO, 'bench', 'results', args.name)
    else:
        outdir = stamp.results_path(args.name)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, 'results.json'), 'w') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    text = report(doc)
    with open(os.path.join(outdir, 'results.md'), 'w') as f:
        f.write(text)
    sys.stdout.write(text)
    failed = sum(r['phases'][k]['failed'] for r in runs for k in r['phases'])
    failed += sum(r['failed_probes'] + len(r['crashes']) for r in runs)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
