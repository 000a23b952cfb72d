#!/usr/bin/env python3
"""Replays a real trace against a simulated inference fleet behind each load
balancing policy in turn, and writes a comparison table and plots.

Every policy sees the same fleet (mock_backend.py, caches and counters reset
between runs) and the same traffic (replay.py with the trace's arrival times
scaled by --speed).  Two bounds come from the trace offline (bounds.py): the
hit ratio of one infinite shared cache, and an oracle router that knows every
replica's cache and load and keeps the same load bound.

    bench/bench.py                       the whole trace, every policy
    bench/bench.py --quick               a slice of the trace, main policies
    bench/bench.py --policies a,b        chosen policies

Results go to bench/results/<name>/: results.md, results.json, *.png.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = REPO                  # for bench.sim, not this directory

from bench.sim import trace  # noqa: E402
from bench.sim.mock_backend import MockProcess  # noqa: E402

SIM = os.path.join(REPO, 'bench', 'sim')
PYTHON = sys.executable

PROXY_PORT = 19300
MOCK_BASE_PORT = 19301


# Each policy: (kind, label, balancer lines).  nginx policies go into an
# upstream block, HAProxy ones into a backend section.
POLICIES = {
    'round_robin': ('nginx', 'nginx round robin', ''),
    'least_conn': ('nginx', 'nginx least_conn', 'least_conn;'),
    'hash_consistent': ('nginx', 'nginx hash $http_x_session_id consistent',
                        'hash $http_x_session_id consistent;'),
    'haproxy_hdr': ('haproxy',
                    'HAProxy hdr(X-Session-ID) consistent, balance factor 125',
                    'balance hdr(X-Session-ID)\n'
                    '    hash-type consistent\n'
                    '    hash-balance-factor 125'),
    'haproxy_body': ('haproxy',
                     'HAProxy hash of the first 4 KB of the body, '
                     'balance factor 125',
                     'option http-buffer-request\n'
                     '    balance hash req.body,bytes(0,4096)\n'
                     '    hash-type consistent\n'
                     '    hash-balance-factor 125'),
    'session_affinity': ('nginx', 'session_affinity (this module)',
                         'session_affinity header=X-Session-ID '
                         'zone=bench_sessions:16m;\n'
                         '        affinity_balance factor=1.25 slack=2;'),
    'prefix_default': ('nginx', 'prefix_affinity (defaults; this module)',
                       'prefix_affinity zone=bench_prefixes:32m;'),
    'prefix_seeds': ('nginx',
                     'prefix_affinity lengths=100,500,1000 step=0 '
                     '(seed lengths only)',
                     'prefix_affinity lengths=100,500,1000 step=0 '
                     'zone=bench_prefixes:32m;'),
    'prefix_coarse': ('nginx', 'prefix_affinity step=2048 growth=12',
                      'prefix_affinity step=2048 growth=12 '
                      'zone=bench_prefixes:32m;'),
    'prefix_fine': ('nginx', 'prefix_affinity step=128 growth=3',
                    'prefix_affinity step=128 growth=3 '
                    'zone=bench_prefixes:32m;'),
    'prefix_8k': ('nginx', 'prefix_affinity max=8k',
                  'prefix_affinity max=8k zone=bench_prefixes:32m;'),
    'prefix_long': ('nginx', 'prefix_affinity max=128k',
                    'prefix_affinity max=128k zone=bench_prefixes:32m;'),
    'session_prefix': ('nginx', 'session_affinity + prefix_affinity',
                       'session_affinity header=X-Session-ID '
                       'zone=bench_sessions:16m;\n'
                       '        prefix_affinity zone=bench_prefixes:32m;'),
}

QUICK_POLICIES = ['round_robin', 'least_conn', 'hash_consistent',
                  'haproxy_hdr', 'session_affinity', 'prefix_default']

# The comparison that chose prefix_affinity's default levels (README).
LEVEL_POLICIES = ['prefix_default', 'prefix_seeds', 'prefix_coarse',
                  'prefix_fine', 'prefix_8k', 'prefix_long']


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


def start_mock(workdir, replicas, args):
    """The mock replicas, one process, one port each."""
    return MockProcess(
        [MOCK_BASE_PORT + i for i in range(replicas)],
        '--max-running', args.max_running,
        '--prefill-ms-per-token', args.prefill_ms_per_token,
        '--decode-ms-per-token', args.decode_ms_per_token,
        '--cache-tokens', args.cache_tokens,
        '--time-scale', 1.0 / args.speed,
        log=os.path.join(workdir, 'mock.log'))


class Proxy:
    """nginx (with the module loaded) or HAProxy in front of the fleet."""

    def __init__(self, workdir, kind, lines, ports, module, nginx_bin):
        self.kind = kind
        self.dir = os.path.join(workdir, 'proxy')
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(os.path.join(self.dir, 'tmp'))
        servers = ports

        if kind == 'nginx':
            conf = os.path.join(self.dir, 'nginx.conf')
            with open(conf, 'w') as f:
                f.write(self.nginx_conf(lines, servers, module))
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
            wait_port(PROXY_PORT)
        except RuntimeError:
            self.proc.kill()
            with open(log_path) as f:
                raise RuntimeError(f'{kind} did not start:\n{f.read()}')

    def nginx_conf(self, lines, servers, module):
        d = self.dir
        upstream = '\n'.join(f'        server 127.0.0.1:{p};'
                             for p in servers)
        return f'''load_module {module};
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

    upstream fleet {{
{upstream}
        {lines}
    }}

    server {{
        listen 127.0.0.1:{PROXY_PORT} backlog=4096;
        location / {{
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
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
    timeout client 600s
    timeout server 600s

frontend fe
    bind 127.0.0.1:{PROXY_PORT}
    default_backend fleet

backend fleet
    {lines}
{upstream}
'''

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT if self.kind == 'nginx'
                              else signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def run_policy(name, fleet, workdir, args):
    kind, label, lines = POLICIES[name]
    proxy = Proxy(workdir, kind, lines, fleet.ports, args.module,
                  args.nginx)
    out = os.path.join(workdir, f'{name}.json')
    cmd = [PYTHON, os.path.join(SIM, 'replay.py'),
           '--url', f'http://127.0.0.1:{PROXY_PORT}/v1/chat/completions',
           '--trace', args.trace, '--speed', str(args.speed),
           '--session-header', '--stats-urls', ','.join(fleet.stats_urls()),
           '--label', name, '--output', out]
    if args.limit:
        cmd += ['--limit', str(args.limit)]
    try:
        subprocess.run(cmd, check=True)
    finally:
        proxy.stop()
    with open(out) as f:
        s = json.load(f)['summary']
    # replay.py resets the replicas' counters before it starts, so the
    # peaks reported by the replicas cover this run only.
    return {'policy': name, 'label': label,
            'hit_ratio': s['hit_ratio'],
            'requests_max_over_mean': ratio(s['replica_requests_max'],
                                            s['replica_requests_mean']),
            'peak_inflight_max_over_mean': ratio(
                s['server_peak_inflight_max'], s['server_peak_inflight_mean']),
            'ttft_p50': s['ttft_trace_s']['p50'],
            'ttft_p90': s['ttft_trace_s']['p90'],
            'ttft_p99': s['ttft_trace_s']['p99'],
            'errors': s['errors']}


def ratio(a, b):
    return a / b if a is not None and b else None


def oracle_row(bounds):
    o = bounds['oracle']
    return {'policy': 'oracle',
            'label': '*oracle: longest cached prefix under the same bound '
                     '(offline)*',
            'hit_ratio': o['hit_ratio'],
            'requests_max_over_mean': ratio(o['replica_requests_max'],
                                            o['replica_requests_mean']),
            'peak_inflight_max_over_mean': ratio(o['peak_inflight_max'],
                                                 o['peak_inflight_mean']),
            'ttft_p50': o['ttft_s']['p50'],
            'ttft_p90': o['ttft_s']['p90'],
            'ttft_p99': o['ttft_s']['p99'],
            'errors': '-'}


def run_bounds(workdir, args):
    out = os.path.join(workdir, 'bounds.json')
    cmd = [PYTHON, os.path.join(SIM, 'bounds.py'), '--trace', args.trace,
           '--replicas', str(args.replicas), '--factor', '1.25',
           '--max-running', str(args.max_running),
           '--prefill-ms-per-token', str(args.prefill_ms_per_token),
           '--decode-ms-per-token', str(args.decode_ms_per_token),
           '--cache-tokens', str(args.cache_tokens), '--output', out]
    if args.limit:
        cmd += ['--limit', str(args.limit)]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def fmt(x, digits=3):
    return '-' if x is None else f'{x:.{digits}f}'


def write_table(results, bounds, args, path):
    oracle = oracle_row(bounds)
    best = oracle['hit_ratio']
    lines = [
        f'Trace: `{os.path.basename(args.trace)}`'
        + (f', first {args.limit} requests' if args.limit else ', all requests')
        + f', replayed {args.speed:g}x faster; {args.replicas} mock replicas'
        f' (max_running {args.max_running}, prefill'
        f' {args.prefill_ms_per_token} ms/token, decode'
        f' {args.decode_ms_per_token} ms/token, KV cache'
        f' {args.cache_tokens} tokens each). TTFT in trace seconds.',
        '',
        '| policy | hit ratio | of oracle | requests max/mean |'
        ' peak in-flight max/mean | TTFT p50 | TTFT p90 | TTFT p99 | errors |',
        '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ]
    for r in results + [oracle]:
        lines.append(
            f"| {r['label']} | {fmt(r['hit_ratio'])} |"
            f" {fmt(r['hit_ratio'] / best if best else None, 2)} |"
            f" {fmt(r['requests_max_over_mean'], 2)} |"
            f" {fmt(r['peak_inflight_max_over_mean'], 2)} |"
            f" {fmt(r['ttft_p50'], 2)} | {fmt(r['ttft_p90'], 2)} |"
            f" {fmt(r['ttft_p99'], 2)} | {r['errors']} |")
    lines.append(
        f"| *infinite shared cache (offline)* |"
        f" {fmt(bounds['infinite_cache_hit_ratio'])} | | | | | | | |")
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return '\n'.join(lines)


def write_plots(results, bounds, outdir):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        log('bench: matplotlib missing (python3-matplotlib); no plots')
        return

    rows = results + [oracle_row(bounds)]
    names = [r['policy'] for r in rows]

    def bars(filename, title, series, ylabel):
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(series)
        for k, (label, key) in enumerate(series):
            values = [r.get(key) or 0 for r in rows]
            xs = [i + k * width for i in range(len(names))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks([i + width * (len(series) - 1) / 2
                       for i in range(len(names))])
        ax.set_xticklabels(names, rotation=20, ha='right')
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, filename), dpi=110)
        plt.close(fig)

    bars('hit_ratio.png', 'KV cache hit ratio (cached / prompt tokens)',
         [('hit ratio', 'hit_ratio')], 'hit ratio')
    bars('balance.png', 'Load balance (max / mean over replicas)',
         [('requests', 'requests_max_over_mean'),
          ('peak in-flight', 'peak_inflight_max_over_mean')], 'max / mean')
    bars('ttft.png', 'Time to first token (trace seconds)',
         [('p50', 'ttft_p50'), ('p90', 'ttft_p90'), ('p99', 'ttft_p99')],
         'seconds')


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--trace', default=trace.DEFAULT_TRACE)
    ap.add_argument('--quick', action='store_true',
                    help='first 2000 requests, main policies')
    ap.add_argument('--limit', type=int, default=0)
    ap.add_argument('--speed', type=float, default=20.0)
    ap.add_argument('--replicas', type=int, default=4)
    ap.add_argument('--policies', default='')
    ap.add_argument('--levels', action='store_true',
                    help='first 2000 requests, prefix_affinity level variants')
    ap.add_argument('--name', default='')
    ap.add_argument('--max-running', type=int, default=32)
    ap.add_argument('--prefill-ms-per-token', type=float, default=0.05)
    ap.add_argument('--decode-ms-per-token', type=float, default=20.0)
    # KV cache per replica: a GPU's own cache (~0.3M tokens for an 8B model
    # on 80 GB) holds under a minute of this trace while conversations come
    # back after two minutes (median), so every policy would score ~5%.
    # 4M tokens is a replica with CPU offload, where placement decides.
    ap.add_argument('--cache-tokens', type=int, default=4194304)
    ap.add_argument('--module', default=os.environ.get(
        'AFFINITY_MODULE',
        os.path.join(REPO, 'build', 'ngx_http_upstream_affinity_module.so')))
    ap.add_argument('--nginx', default=os.environ.get('NGINX_BIN',
                                                      '/usr/sbin/nginx'))
    args = ap.parse_args()

    if (args.quick or args.levels) and not args.limit:
        args.limit = 2000
    policies = (args.policies.split(',') if args.policies
                else QUICK_POLICIES if args.quick
                else LEVEL_POLICIES if args.levels else list(POLICIES))
    name = args.name or ('quick' if args.quick
                         else 'levels' if args.levels else 'full')
    outdir = os.path.join(REPO, 'bench', 'results', name)
    workdir = os.path.join(REPO, 'build', 'bench', name)
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(workdir, exist_ok=True)

    for p in policies:
        if p not in POLICIES:
            sys.exit(f'bench: unknown policy {p}; known: {", ".join(POLICIES)}')

    log(f'bench: offline bounds ({args.limit or "all"} requests)')
    bounds = run_bounds(workdir, args)

    fleet = start_mock(workdir, args.replicas, args)
    results = []
    try:
        for p in policies:
            log(f'bench: {p}')
            results.append(run_policy(p, fleet, workdir, args))
    finally:
        fleet.stop()

    table = write_table(results, bounds, args,
                        os.path.join(outdir, 'results.md'))
    with open(os.path.join(outdir, 'results.json'), 'w') as f:
        json.dump({'args': {k: v for k, v in vars(args).items()
                            if k not in ('module', 'nginx', 'trace')},
                   'trace': os.path.basename(args.trace),
                   'results': results, 'bounds': bounds}, f, indent=1)
    write_plots(results, bounds, outdir)
    print()
    print(table)


if __name__ == '__main__':
    main()
