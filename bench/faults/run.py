#!/usr/bin/env python3
"""Fault and soak benchmark of the affinity module.

nginx with the module (4 workers; an upstream of 4 backends with
session_affinity, prefix_affinity and affinity_balance; affinity_status on
a port of its own) in front of 4 HTTP backends on loopback (backend.py),
under a steady mix of good and bad requests (traffic.py), while faults are
injected:

    nginx -s reload                         every --reload-every seconds
    kill -9 of a random worker              every --kill-every seconds
    one backend killed, restarted after     every --backend-cycle seconds,
      --backend-down seconds                  the next backend each time

Every second: each worker's RSS (/proc/PID/status, by pid), the worker
pids, the status endpoint's per-peer in-flight, the client's own in-flight
count.  At the end the load stops, the run settles for --settle seconds and
the status is read: in-flight left over must be 0.  report.py turns the
raw data (in the work directory) into faults.json, faults.md and
faults-rss.png, in build/bench/, or with RECORD=1 in the environment in the
committed bench/results/ (bench/stamp.py); faults.md and faults.json begin
with the run's command line, commit, module version and date.

    bench/faults/run.py                      FAULT_SECONDS (default 300)
    bench/faults/run.py --short              60 s, faults closer together;
                                             results stay in the work dir
                                             even with RECORD=1
    bench/faults/run.py --seconds 900 --concurrency 32
    bench/faults/run.py --sanitizer-dir DIR  nginx under
        scripts/sanitizer-env.sh DIR (AFFINITY_MODULE a sanitizer build);
        reports in DIR are counted
    bench/faults/report.py WORKDIR [RESULTS_DIR]   the report again

Environment: NGINX_BIN (/usr/sbin/nginx), AFFINITY_MODULE
(build/ngx_http_upstream_affinity_module.so), FAULT_SECONDS, FAULT_SHORT=1,
FAULT_CONCURRENCY, FAULT_RELOAD_EVERY, FAULT_KILL_EVERY,
FAULT_BACKEND_CYCLE, FAULT_BACKEND_DOWN, FAULT_WORKDIR, FAULT_RESULTS.

Every process started here is stopped on exit, Ctrl-C included.
"""

import argparse
import asyncio
import ctypes
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)

import report    # noqa: E402
import traffic   # noqa: E402
from bench import stamp         # noqa: E402
from bench.sim import http1     # noqa: E402

NBACKENDS = 4
WORKERS = 4
CONN_ERRORS = (ConnectionError, asyncio.IncompleteReadError, OSError)


def log(msg):
    print(msg, flush=True)


def repo_relative(path):
    """A path inside the checkout as relative to it: results are
    committed, and must not name this machine's directories."""
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    return path


def env(name, default, conv=str):
    v = os.environ.get(name)
    return conv(v) if v not in (None, '') else default


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def pdeathsig(sig):
    """preexec_fn: the child gets sig when this process dies, whatever
    the way (so a kill -9 of the driver leaves no backend behind)."""
    def f():
        _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return f


def proc_stat(pid):
    """(ppid, starttime) of a process, or None."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rfind(')') + 2:].split()
    return int(rest[1]), int(rest[19])


def proc_cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').decode('latin-1').strip()
    except OSError:
        return ''


def proc_mem(pid):
    """VmRSS, RssAnon, RssShmem in kB, or None if the process is gone."""
    out = {}
    try:
        with open('/proc/%d/status' % pid) as f:
            for line in f:
                if line.startswith(('VmRSS:', 'RssAnon:', 'RssShmem:')):
                    k, v = line.split(':', 1)
                    out[k] = int(v.split()[0])
    except OSError:
        return None
    if 'VmRSS' not in out:
        return None
    return out


def children(ppid):
    out = []
    for d in os.listdir('/proc'):
        if d.isdigit():
            st = proc_stat(int(d))
            if st and st[0] == ppid:
                out.append(int(d))
    return sorted(out)


def free_ports(n):
    """n free loopback ports below the ephemeral range, so that no client
    socket takes a backend's port while that backend is down."""
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            low = int(f.read().split()[0])
    except OSError:
        low = 32768
    rng = random.Random()
    ports = []
    tries = 0
    while len(ports) < n:
        tries += 1
        if tries > 10000:
            raise RuntimeError('no free ports')
        p = rng.randrange(max(1024, low - 12000), low - 1)
        if p in ports:
            continue
        s = socket.socket()
        try:
            s.bind(('127.0.0.1', p))
        except OSError:
            continue
        finally:
            s.close()
        ports.append(p)
    return ports


class Fleet:
    """nginx and the backends: started, killed, restarted and stopped."""

    def __init__(self, args, workdir):
        self.args = args
        self.dir = workdir
        self.backends = [None] * NBACKENDS
        self.backend_logs = []
        self.nginx = None
        self.seen_workers = {}      # pid -> starttime, every worker seen
        self.wrap = []
        if args.sanitizer_dir:
            self.wrap = ['sh', os.path.join(REPO, 'scripts',
                                            'sanitizer-env.sh'),
                         args.sanitizer_dir]

    # -- backends ---------------------------------------------------------

    def start_backend(self, i, wait=True):
        # Always from the main thread: PR_SET_PDEATHSIG fires when the
        # thread that forked the child ends.
        port = self.args.backend_ports[i]
        logf = open(os.path.join(self.dir, 'backend-%d.log' % (i + 1)), 'a')
        self.backend_logs.append(logf)
        p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, 'backend.py'),
             '--port', str(port), '--name', 'b%d' % (i + 1)],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=pdeathsig(signal.SIGKILL))
        self.backends[i] = p
        if wait:
            wait_port(port, 10, p)
        return p

    def kill_backend(self, i):
        p = self.backends[i]
        if p is not None:
            p.kill()
            p.wait()
            self.backends[i] = None

    # -- nginx ------------------------------------------------------------

    def nginx_cmd(self, *extra):
        return self.wrap + [self.args.nginx, '-p', self.dir,
                            '-c', os.path.join(self.dir, 'nginx.conf')] + \
            list(extra)

    def start_nginx(self):
        out = open(os.path.join(self.dir, 'nginx.stderr'), 'a')
        e = dict(os.environ)
        e['AFFINITY_MODULE'] = self.args.module_copy
        self.nginx = subprocess.Popen(
            self.nginx_cmd('-g', 'daemon off;'), stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e,
            start_new_session=True, preexec_fn=pdeathsig(signal.SIGTERM))
        wait_port(self.args.port, 15, self.nginx)
        wait_port(self.args.status_port, 15, self.nginx)

    def reload(self):
        e = dict(os.environ)
        e['AFFINITY_MODULE'] = self.args.module_copy
        r = subprocess.run(self.nginx_cmd('-s', 'reload'), env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=30)
        return r.returncode, r.stdout.decode('latin-1', 'replace').strip()

    def workers(self):
        """[(pid, current)]: the master's children; current is False for
        workers of an older configuration that are shutting down."""
        if self.nginx is None:
            return []
        out = []
        for pid in children(self.nginx.pid):
            cmd = proc_cmdline(pid)
            if 'worker process' not in cmd:
                continue
            st = proc_stat(pid)
            if st:
                self.seen_workers.setdefault(pid, st[1])
            out.append((pid, 'shutting down' not in cmd))
        return out

    # -- stopping ---------------------------------------------------------

    def stop(self):
        if self.nginx is not None and self.nginx.poll() is None:
            self.workers()          # note the last workers' pids
            try:
                self.nginx.send_signal(signal.SIGQUIT)
                self.nginx.wait(20)
            except subprocess.TimeoutExpired:
                self.nginx.terminate()
                try:
                    self.nginx.wait(5)
                except subprocess.TimeoutExpired:
                    self.nginx.kill()
                    self.nginx.wait()
        # Workers outlive a master killed with SIGKILL: stop any worker this
        # run started that still runs (same pid and start time).
        for pid, start in self.seen_workers.items():
            st = proc_stat(pid)
            if st and st[1] == start and 'nginx' in proc_cmdline(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for i in range(NBACKENDS):
            p = self.backends[i]
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for f in self.backend_logs:
            f.close()


def wait_port(port, timeout, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError('process %s exited with %s before port %d '
                               'listened' % (proc.args, proc.returncode, port))
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError('nothing listens on port %d' % port)


async def wait_port_async(port, timeout, proc):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError('exited with %s before port %d listened'
                               % (proc.returncode, port))
        try:
            _, w = await asyncio.open_connection('127.0.0.1', port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError('nothing listens on port %d' % port)


def nginx_conf(args, d):
    servers = '\n'.join('        server 127.0.0.1:%d max_fails=1 '
                        'fail_timeout=5s;' % p for p in args.backend_ports)
    return f'''# written by bench/faults/run.py
load_module {args.module_copy};
worker_processes {WORKERS};
worker_shutdown_timeout 30s;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}

http {{
    client_body_temp_path {d}/client_body_temp;
    proxy_temp_path {d}/proxy_temp;
    client_max_body_size 32m;
    client_body_buffer_size 1m;

    log_format faults '$msec $pid $http_x_req_id $status $request_length '
                      '"$upstream_addr" "$upstream_status" $affinity_route '
                      '$request_time';
    access_log {d}/access.log faults;

    upstream fleet {{
{servers}
        session_affinity header=X-Session-ID field=prompt_cache_key
                         field=metadata.session_id
                         zone=faults_sessions:8m timeout=1h;
        prefix_affinity zone=faults_prefixes:16m timeout=10m;
        affinity_balance factor=1.25 slack=2;
        keepalive 16;
    }}

    server {{
        listen 127.0.0.1:{args.port} backlog=4096;

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_connect_timeout 2s;
        proxy_read_timeout 30s;
        proxy_send_timeout 30s;

        add_header X-Route $affinity_route always;
        add_header X-Worker $pid always;
        add_header X-Upstream $upstream_addr always;

        location /v1/ {{
            proxy_pass http://fleet;
        }}

        # bodies over 16k go to temporary files
        location /small-buffer/v1/ {{
            client_body_buffer_size 16k;
            proxy_pass http://fleet/v1/;
        }}
    }}

    server {{
        listen 127.0.0.1:{args.status_port};
        access_log off;
        location = /status {{
            affinity_status;
        }}
    }}
}}
'''


# ---------------------------------------------------------------------------
# HTTP client
# ---------------------------------------------------------------------------

async def exchange(port, head, body, resp):
    reader, writer = await asyncio.open_connection('127.0.0.1', port,
                                                   limit=1 << 20)
    try:
        resp.phase = 'send'
        writer.write(head)
        if body:
            writer.write(body)
        # A response may come before the whole body went (it should not
        # here), so read while the body drains.
        drain = asyncio.ensure_future(writer.drain())
        try:
            await http1.read_response(reader, resp)
        finally:
            if not drain.done():
                drain.cancel()
            else:
                drain.exception()
    finally:
        writer.close()


def check_echo(req, rid, resp):
    """'' when the backend saw this request's body unchanged, else why not."""
    data = resp.body
    if req.stream:
        found = None
        for line in data.split(b'\n'):
            if line.startswith(b'data: {"backend"'):
                found = line[6:]
        if found is None:
            return 'no result event in the stream'
        data = found
    try:
        echo = json.loads(data)
    except ValueError:
        return 'response body is not the backend\'s JSON'
    if echo.get('req') != rid:
        return 'answer for request %r' % echo.get('req')
    if echo.get('len') != len(req.body):
        return 'backend got %s bytes of %d' % (echo.get('len'), len(req.body))
    if echo.get('sha1') != req.sha1:
        return 'backend got another body (SHA-1 differs)'
    return ''


class Load:
    def __init__(self, args, fleet, t0):
        self.args = args
        self.fleet = fleet
        self.t0 = t0
        self.traffic = traffic.Traffic(args.seed, args.corpus)
        self.stop = False
        self.inflight = 0
        self.next_id = 0
        self.sent = 0
        self.ok = 0
        self.failed = 0
        self.out = open(os.path.join(args.workdir, 'requests.jsonl'), 'w')
        self.events = []

    def now(self):
        return time.monotonic() - self.t0

    def event(self, kind, **kw):
        e = {'t': round(self.now(), 3), 'kind': kind}
        e.update(kw)
        self.events.append(e)
        return e

    async def send(self, req):
        self.next_id += 1
        rid = 'r%d' % self.next_id
        hdrs = [('Host', 'faults'), ('Connection', 'close'),
                ('X-Req-Id', rid)] + list(req.headers)
        if req.delay_ms:
            hdrs.append(('X-Delay-Ms', str(req.delay_ms)))
        if req.stream:
            hdrs.append(('X-Stream', '4'))
        if req.method != 'GET':
            hdrs.append(('Content-Length', str(len(req.body))))
        head = http1.request_head(req.method, req.path, hdrs)
        resp = http1.Response()
        rec = {'id': rid, 'cls': req.cls, 'sub': req.sub,
               'loc': 'file' if req.path.startswith('/small') else 'mem',
               'bytes': len(req.body), 'delay': req.delay_ms,
               'stream': bool(req.stream), 't0': round(self.now(), 4)}
        self.inflight += 1
        self.sent += 1
        err = ''
        try:
            await asyncio.wait_for(
                exchange(self.args.port, head, req.body, resp),
                self.args.request_timeout)
        except asyncio.TimeoutError:
            err = 'timeout'
        except asyncio.IncompleteReadError:
            err = 'eof'
        except ConnectionResetError:
            err = 'reset'
        except BrokenPipeError:
            err = 'broken_pipe'
        except ConnectionRefusedError:
            err = 'refused'
        except (OSError, ValueError, IndexError, http1.HttpError) as e:
            err = '%s: %s' % (type(e).__name__, e)
        finally:
            self.inflight -= 1
        rec['t1'] = round(self.now(), 4)
        rec['status'] = resp.status
        rec['err'] = err
        rec['phase'] = resp.phase if err else ''
        h = resp.headers
        rec['route'] = h.get('x-route', '')
        rec['worker'] = h.get('x-worker', '')
        rec['backend'] = h.get('x-backend', '')
        rec['upstream'] = h.get('x-upstream', '')
        check = ''
        if not err and resp.status == 200:
            check = check_echo(req, rid, resp)
        rec['check'] = check
        rec['ok'] = not err and resp.status == 200 and not check
        if rec['ok']:
            self.ok += 1
        else:
            self.failed += 1
        self.out.write(json.dumps(rec) + '\n')
        return rec

    async def client(self):
        while not self.stop:
            await self.send(self.traffic.draw())

    async def huge(self):
        every = self.args.huge_every
        if every <= 0:
            return
        while not self.stop:
            await sleep_until(self, every * (1 + int(self.now() / every)))
            if self.stop:
                break
            req = self.traffic.huge()
            req.delay_ms = 0
            await self.send(req)


async def sleep_until(load, t):
    while not load.stop:
        d = t - load.now()
        if d <= 0:
            return
        await asyncio.sleep(min(d, 0.5))


async def http_get(port, path, timeout=5):
    resp = http1.Response()
    head = http1.request_head('GET', path, [('Host', 'status'),
                                            ('Connection', 'close')])
    await asyncio.wait_for(exchange(port, head, b'', resp), timeout)
    return resp


async def read_status(port):
    try:
        resp = await http_get(port, '/status')
        if resp.status != 200:
            return {'error': 'status %s' % resp.status}
        return json.loads(resp.body)
    except Exception as e:          # noqa: BLE001  (reported, not fatal)
        return {'error': '%s: %s' % (type(e).__name__, e)}


def status_brief(st):
    """What a sample keeps of the status: per-peer in-flight and requests,
    the zones' worker figures."""
    if 'error' in st:
        return st
    out = {'peers': {}, 'zones': {}}
    for uname, u in st.get('upstreams', {}).items():
        for p in u.get('peers', []):
            out['peers'][p['name']] = [p.get('inflight'), p.get('requests'),
                                       p.get('failures'), p.get('counted')]
        for kind, z in u.get('zones', {}).items():
            out['zones'][kind] = z.get('workers')
    return out


# ---------------------------------------------------------------------------
# Faults and sampling
# ---------------------------------------------------------------------------

async def reloader(load):
    every = load.args.reload_every
    if every <= 0:
        return
    n = 1
    while not load.stop:
        # offsets apart from the kills and outages, so that a failure
        # points at one fault
        await sleep_until(load, every * (n - 1) + 0.41 * every)
        if load.stop:
            break
        n += 1
        loop = asyncio.get_running_loop()
        t = load.now()
        rc, out = await loop.run_in_executor(None, load.fleet.reload)
        load.events.append({'t': round(t, 3), 'kind': 'reload', 'rc': rc,
                            'out': out[-300:]})


async def killer(load, rng):
    every = load.args.kill_every
    if every <= 0:
        return
    n = 0
    while not load.stop:
        await sleep_until(load, every * n + every / 2)
        if load.stop:
            break
        n += 1
        current = [pid for pid, cur in load.fleet.workers() if cur]
        if not current:
            continue
        pid = rng.choice(current)
        try:
            os.kill(pid, signal.SIGKILL)
            load.event('kill_worker', pid=pid, inflight=load.inflight)
        except OSError as e:
            load.event('kill_worker_failed', pid=pid, error=str(e))


async def backend_faults(load):
    cycle, down = load.args.backend_cycle, load.args.backend_down
    if cycle <= 0 or down <= 0:
        return
    n = 0
    while not load.stop:
        await sleep_until(load, cycle * n + cycle / 3)
        if load.stop:
            break
        i = n % NBACKENDS
        n += 1
        load.fleet.kill_backend(i)
        load.event('backend_down', backend='b%d' % (i + 1),
                   port=load.args.backend_ports[i])
        await sleep_until(load, load.now() + down)
        await restore_backend(load, i)


async def restore_backend(load, i):
    if load.fleet.backends[i] is not None:
        return
    port = load.args.backend_ports[i]
    for attempt in range(20):
        try:
            p = load.fleet.start_backend(i, wait=False)
            await wait_port_async(port, 10, p)
            break
        except RuntimeError as e:
            load.fleet.kill_backend(i)
            load.event('backend_restart_failed', backend='b%d' % (i + 1),
                       error=str(e))
            await asyncio.sleep(0.5)
    load.event('backend_up', backend='b%d' % (i + 1),
               port=load.args.backend_ports[i])


async def sampler(load, samples_path, stop_event):
    with open(samples_path, 'w') as out:
        while not stop_event.is_set():
            t = load.now()
            ws = []
            for pid, cur in load.fleet.workers():
                m = proc_mem(pid)
                if m:
                    ws.append({'pid': pid, 'current': cur,
                               'rss': m.get('VmRSS'),
                               'anon': m.get('RssAnon'),
                               'shmem': m.get('RssShmem')})
            master = proc_mem(load.fleet.nginx.pid) or {}
            inflight = load.inflight
            st = status_brief(await read_status(load.args.status_port))
            try:
                with open('/proc/loadavg') as f:
                    la = float(f.read().split()[0])
            except OSError:
                la = None
            out.write(json.dumps({'t': round(t, 3), 'workers': ws,
                                  'master_rss': master.get('VmRSS'),
                                  'client_inflight': inflight,
                                  'loadavg': la, 'status': st}) + '\n')
            out.flush()
            try:
                await asyncio.wait_for(stop_event.wait(),
                                       max(0.05, load.args.sample_every
                                           - (load.now() - t)))
            except asyncio.TimeoutError:
                pass


async def progress(load):
    last = 0
    while not load.stop:
        await asyncio.sleep(1)
        t = load.now()
        if t - last >= load.args.progress_every:
            last = t
            ws = load.fleet.workers()
            rss = sorted((proc_mem(p) or {}).get('VmRSS', 0)
                         for p, cur in ws if cur)
            log('  t=%4.0fs sent=%d ok=%d failed=%d in-flight=%d workers=%s '
                'rss(median)=%s kB' % (t, load.sent, load.ok, load.failed,
                                       load.inflight,
                                       [p for p, cur in ws if cur],
                                       rss[len(rss) // 2] if rss else '-'))


async def run_load(args, fleet):
    t0 = time.monotonic()
    load = Load(args, fleet, t0)
    stop_sampling = asyncio.Event()
    rng = random.Random(args.seed + 1)
    samples = asyncio.ensure_future(
        sampler(load, os.path.join(args.workdir, 'samples.jsonl'),
                stop_sampling))
    faults = [asyncio.ensure_future(c) for c in
              (reloader(load), killer(load, rng), backend_faults(load),
               progress(load))]
    clients = [asyncio.ensure_future(load.client())
               for _ in range(args.concurrency)]
    clients.append(asyncio.ensure_future(load.huge()))
    try:
        await asyncio.sleep(args.seconds)
        load.stop = True
        load.event('load_stop')
        log('load stops; waiting for the requests in flight')
        for f in faults:
            f.cancel()
        await asyncio.gather(*faults, return_exceptions=True)
        for i in range(NBACKENDS):
            if fleet.backends[i] is None:
                await restore_backend(load, i)
        done, pending = await asyncio.wait(clients,
                                           timeout=args.request_timeout + 10)
        for c in pending:
            c.cancel()
        for c in done:
            if c.exception():
                log('client task failed: %r' % c.exception())
        load.event('load_done', inflight=load.inflight)
        log('settling %d s' % args.settle)
        final = []
        for k in range(args.settle):
            await asyncio.sleep(1)
        final.append({'t': round(load.now(), 3),
                      'status': await read_status(args.status_port)})
        await asyncio.sleep(2)
        final.append({'t': round(load.now(), 3),
                      'status': await read_status(args.status_port)})
        final_workers = fleet.workers()
        load.event('final', workers=[p for p, c in final_workers])
    finally:
        load.stop = True
        stop_sampling.set()
        for t in faults + clients:
            t.cancel()
        await asyncio.gather(samples, *faults, *clients,
                             return_exceptions=True)
        load.out.close()
        with open(os.path.join(args.workdir, 'events.json'), 'w') as f:
            json.dump(load.events, f, indent=1)
    with open(os.path.join(args.workdir, 'final_status.json'), 'w') as f:
        json.dump(final, f, indent=1)
    return load


# ---------------------------------------------------------------------------

def git(*a):
    try:
        return subprocess.run(['git', '-C', REPO] + list(a),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL,
                              timeout=20).stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return ''


def machine():
    m = {'cpus': os.cpu_count()}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    m['cpu'] = line.split(':', 1)[1].strip()
                    break
        with open('/proc/meminfo') as f:
            m['mem_kb'] = int(f.readline().split()[1])
        with open('/proc/loadavg') as f:
            m['loadavg_before'] = f.read().split()[:3]
    except OSError:
        pass
    # what else used the CPU when the run started
    try:
        ps = subprocess.run(['ps', '-eo', 'pcpu,comm', '--sort=-pcpu'],
                            stdout=subprocess.PIPE, timeout=10)
        top = ps.stdout.decode().splitlines()[1:4]
        m['busiest_before'] = [' '.join(x.split()) for x in top]
    except (OSError, subprocess.SubprocessError):
        pass
    return m


def parse_args():
    p = argparse.ArgumentParser(
        description='Fault and soak benchmark of the affinity module',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__)
    short = env('FAULT_SHORT', '') not in ('', '0')
    p.add_argument('--short', action='store_true', default=short,
                   help='a quick check: 60 s, faults every 10-30 s, '
                   'results in the work directory')
    p.add_argument('--seconds', type=float,
                   default=env('FAULT_SECONDS', None, float))
    p.add_argument('--concurrency', type=int,
                   default=env('FAULT_CONCURRENCY', 64, int))
    p.add_argument('--reload-every', type=float,
                   default=env('FAULT_RELOAD_EVERY', None, float))
    p.add_argument('--kill-every', type=float,
                   default=env('FAULT_KILL_EVERY', None, float))
    p.add_argument('--backend-cycle', type=float,
                   default=env('FAULT_BACKEND_CYCLE', None, float))
    p.add_argument('--backend-down', type=float,
                   default=env('FAULT_BACKEND_DOWN', None, float))
    p.add_argument('--huge-every', type=float, default=None,
                   help='seconds between bodies of 17 MB (0: none)')
    p.add_argument('--settle', type=int, default=5)
    p.add_argument('--sample-every', type=float, default=1.0)
    p.add_argument('--progress-every', type=float, default=15.0)
    p.add_argument('--request-timeout', type=float, default=90.0)
    p.add_argument('--seed', type=int, default=env('FAULT_SEED', 1, int))
    p.add_argument('--workdir', default=env(
        'FAULT_WORKDIR', os.path.join(REPO, 'build', 'bench-faults')))
    p.add_argument('--results', default=env('FAULT_RESULTS', None),
                   help='where faults.json/.md/-rss.png go (default: '
                   'build/bench, bench/results with RECORD=1; the work '
                   'directory with --short)')
    p.add_argument('--corpus', default=os.path.join(REPO, 'fuzz', 'corpus'))
    p.add_argument('--sanitizer-dir', default=None)
    p.add_argument('--nginx', default=env('NGINX_BIN', '/usr/sbin/nginx'))
    p.add_argument('--module', default=env(
        'AFFINITY_MODULE',
        os.path.join(REPO, 'build', 'ngx_http_upstream_affinity_module.so')))
    p.add_argument('--no-plot', action='store_true')
    a = p.parse_args()
    if a.short:
        defaults = dict(seconds=60, reload_every=10, kill_every=12,
                        backend_cycle=30, backend_down=10, huge_every=25)
    else:
        defaults = dict(seconds=300, reload_every=30, kill_every=20,
                        backend_cycle=60, backend_down=20, huge_every=60)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.results is None:
        a.results = a.workdir if a.short else stamp.results_root()
    a.workdir = os.path.abspath(a.workdir)
    if a.sanitizer_dir:
        a.sanitizer_dir = os.path.abspath(a.sanitizer_dir)
    return a


def main():
    args = parse_args()
    if not os.path.isfile(args.module):
        sys.exit('no module at %s (make module)' % args.module)
    if os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    os.chmod(args.workdir, 0o755)
    # A copy of the module: a build in parallel replaces the file, and a
    # reload would then load another module than the one measured.
    args.module_copy = os.path.join(args.workdir, 'module.so')
    shutil.copy2(args.module, args.module_copy)
    ports = free_ports(2 + NBACKENDS)
    args.port, args.status_port = ports[:2]
    args.backend_ports = ports[2:]

    with open(args.module_copy, 'rb') as f:
        module_sha1 = hashlib.sha1(f.read()).hexdigest()
    nginx_v = subprocess.run([args.nginx, '-v'], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT).stdout.decode().strip()
    meta = {
        'stamp': stamp.stamp(env=sorted(k for k in os.environ
                                        if k.startswith('FAULT_'))),
        'command': ' '.join([os.path.relpath(sys.argv[0], REPO)]
                            + sys.argv[1:]),
        'env': {k: repo_relative(os.environ[k]) for k in sorted(os.environ)
                if k.startswith('FAULT_') or k in ('NGINX_BIN',
                                                   'AFFINITY_MODULE')},
        'started': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
        'short': args.short,
        'seconds': args.seconds,
        'concurrency': args.concurrency,
        'reload_every': args.reload_every,
        'kill_every': args.kill_every,
        'backend_cycle': args.backend_cycle,
        'backend_down': args.backend_down,
        'huge_every': args.huge_every,
        'settle': args.settle,
        'workers': WORKERS,
        'backends': NBACKENDS,
        'seed': args.seed,
        'nginx': args.nginx,
        'nginx_version': nginx_v,
        'module': repo_relative(args.module),
        'module_sha1': module_sha1,
        'git_head': git('rev-parse', '--short', 'HEAD'),
        'git_dirty': [line for line in git('status', '--porcelain', '--',
                                           'src', 'config',
                                           'config.make').splitlines()],
        'sanitizer_dir': args.sanitizer_dir,
        'machine': machine(),
        'ports': {'nginx': args.port, 'status': args.status_port,
                  'backends': args.backend_ports},
    }
    with open(os.path.join(args.workdir, 'nginx.conf'), 'w') as f:
        f.write(nginx_conf(args, args.workdir))

    fleet = Fleet(args, args.workdir)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    # also when started in the background, where SIGINT comes ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)

    log('fault benchmark: %g s, %d clients, reload every %g s, kill a '
        'worker every %g s, a backend down %g s every %g s; work dir %s'
        % (args.seconds, args.concurrency, args.reload_every,
           args.kill_every, args.backend_down, args.backend_cycle,
           args.workdir))
    interrupted = False
    wall0 = time.monotonic()
    try:
        for i in range(NBACKENDS):
            fleet.start_backend(i)
        fleet.start_nginx()
        time.sleep(0.5)
        meta['first_workers'] = [p for p, c in fleet.workers()]
        asyncio.run(run_load(args, fleet))
    except KeyboardInterrupt:
        interrupted = True
        log('interrupted; stopping everything')
    finally:
        fleet.stop()
    with open('/proc/loadavg') as f:
        meta['machine']['loadavg_after'] = f.read().split()[:3]
    # CPU used by this run: the driver (client, sampler) and its children
    # once stopped (nginx with every worker it reaped, the backends)
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    meta['cpu'] = {'wall_s': round(time.monotonic() - wall0, 1),
                   'driver_s': round(me.ru_utime + me.ru_stime, 1),
                   'nginx_and_backends_s': round(ch.ru_utime + ch.ru_stime,
                                                 1)}
    meta['seen_workers'] = len(fleet.seen_workers)
    meta['interrupted'] = interrupted
    with open(os.path.join(args.workdir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    if interrupted:
        sys.exit(130)
    summary = report.analyze(args.workdir)
    report.write(summary, args.workdir, args.results, plot=not args.no_plot)
    report.print_summary(summary)
    return 0 if report.clean(summary) else 1


if __name__ == '__main__':
    sys.exit(main())
