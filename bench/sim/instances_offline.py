#!/usr/bin/python3
"""Several instances of the module, offline: one, and four sharing a store
and the engines' figures (core_policy.Instances), on a workload of the
tight profile, with the store's messages reaching the other instances at
once or some milliseconds later, and the conversation trace's requests at
its own times (in ticks of 3 s) or each at a random moment of its tick.
What separates what sharing state loses from what the store's latency
loses, deterministically, in minutes.

    /usr/bin/python3 bench/sim/instances_offline.py [--workloads conversation]
        [--seeds 3] [--latencies 0,0.01,0.1] [--name instances-offline]
        [--read-lag 0] [--poll-lag 0] [--transit 0]

writes bench/results/<name>/results.json and results.md.  Latencies are in
seconds of profile time: the replay of bench.py runs 20 times faster than
real time, so 0.01 s stands for a store 0.5 ms away.  --read-lag,
--poll-lag and --transit are bounds.py's, the last two for one instance
too.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ''):       # run as a file
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench.sim import bounds, workloads  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ONE = 'module_x1_metrics'
SHARED = 'module_x4_shared'


def simulate(requests, params, replicas, name, latency, lags):
    s, _ = bounds.simulate(requests, name, replicas, params,
                           store_latency=latency, **lags)
    return {'hit_ratio': s['hit_ratio'], 'ttft_p50': s['ttft_s']['p50'],
            'peak_inflight': s['peak_inflight_max']}


def case(workload, seed, arrivals, latencies, lags, shared=SHARED):
    """Every figure of one workload slice: {sessions: {label: figures}}."""
    argv = ['--workload', workload, '--seed', str(seed), '--size', 'full',
            '--profile', 'tight']
    if arrivals != 'trace':
        argv += ['--arrivals', arrivals]
    args = bounds.parse_args(argv)
    profile = args.fleet_profile
    requests = bounds.prepare_workload(workloads.from_args(args),
                                       profile.rate_multiplier)
    params = profile.replica_params(bounds.distinct_blocks(requests))
    out = {}
    for sessions in ('on', 'off'):
        sent = requests if sessions == 'on' \
            else bounds.with_sessions(requests, False)
        alone = dict(lags, read_lag=0.0)       # it reads no store
        figures = {'one': simulate(sent, params, profile.replicas, ONE, 0,
                                   alone)}
        for latency in latencies:
            figures['four@%g' % latency] = simulate(
                sent, params, profile.replicas, shared, latency, lags)
        out[sessions] = figures
    return out


def ratio_cell(values):
    """The median, and the spread unless it rounds to the median."""
    values = sorted(values)
    low, mid, high = ('%.2f' % v for v in (values[0],
                                           statistics.median(values),
                                           values[-1]))
    return mid if low == high else '%s [%s–%s]' % (mid, low, high)


def signed_cell(values):
    values = sorted(values)
    text = '%+g' % statistics.median(values)
    if values[0] != values[-1]:
        text += ' [%+d..%+d]' % (values[0], values[-1])
    return text


def lags_text(doc):
    """The lags of the run, as a sentence, if any."""
    lags = doc.get('lags', {})
    given = ['%s %g' % (name.replace('_', '-'), value)
             for name, value in sorted(lags.items()) if value]
    if not given:
        return ''
    return ('  bounds.py\'s --%s (seconds of profile time; one instance '
            'with the same but --read-lag).' % ', --'.join(given))


def report(doc):
    lines = ['# ' + doc['name'], '',
             'Offline (bench/sim/instances_offline.py), tight profile, '
             'full size, seeds %s: four instances sharing a store and the '
             "engines' figures (%s) against one with the "
             "engines' figures (module_x1_metrics), seed by seed: hits ÷ "
             "one's / TTFT p50 ÷ one's / peak in-flight − one's, median "
             '[min–max].  Latency: seconds of profile time before what one '
             'instance publishes reaches the others (0.01: a store 0.5 ms '
             'away, replayed 20 times faster than real time).  Arrivals: '
             "the trace's times, in ticks of 3 s, or each request at a "
             'random moment of its tick.%s' % (', '.join(
                 str(s) for s in doc['seeds']),
                 doc.get('policy', SHARED), lags_text(doc)), '',
             '| workload | arrivals | sessions | latency | four ÷ one |',
             '|---|---|---|---:|---|']
    for workload, by_arrivals in doc['results'].items():
        for arrivals, seeds in by_arrivals.items():
            for sessions in ('on', 'off'):
                for latency in doc['latencies']:
                    label = 'four@%g' % latency
                    hits, ttft, peak = [], [], []
                    for figures in seeds.values():
                        one, four = figures[sessions]['one'], \
                            figures[sessions][label]
                        hits.append(four['hit_ratio'] / one['hit_ratio'])
                        ttft.append(four['ttft_p50'] / one['ttft_p50'])
                        peak.append(four['peak_inflight']
                                    - one['peak_inflight'])
                    lines.append('| %s | %s | %s | %g | %s / %s / %s |' % (
                        workload, arrivals, sessions, latency,
                        ratio_cell(hits), ratio_cell(ttft),
                        signed_cell(peak)))
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--workloads', default='conversation',
                   help='comma-separated, from: ' + ', '.join(workloads.NAMES))
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--latencies', default='0,0.01,0.1',
                   help='comma-separated seconds of profile time')
    p.add_argument('--name', default='instances-offline')
    p.add_argument('--spread', choices=('request', 'client'),
                   default='request',
                   help='the four instances behind a front that sends each '
                        'request to one at random (default), or every '
                        'request of a session to the same one')
    for lag in ('read-lag', 'poll-lag', 'transit'):
        p.add_argument('--' + lag, type=float, default=0.0,
                       help="bounds.py's (default %(default)s)")
    args = p.parse_args(argv)
    lags = {'read_lag': args.read_lag, 'poll_lag': args.poll_lag,
            'transit': args.transit}
    latencies = [float(x) for x in args.latencies.split(',')]
    names = args.workloads.split(',')
    for name in names:
        if name not in workloads.NAMES:
            p.error('unknown workload %r' % name)
    shared = SHARED + ('_client' if args.spread == 'client' else '')
    started = time.time()
    results = {}
    for name in names:
        results[name] = {}
        for a in ('trace', 'spread') if name == 'conversation' \
                else ('trace',):
            results[name][a] = {}
            for seed in range(1, args.seeds + 1):
                results[name][a][str(seed)] = case(name, seed, a,
                                                   latencies, lags, shared)
                print('%s/%s/%d done' % (name, a, seed), flush=True)
    doc = {'name': args.name, 'policy': shared,
           'seeds': list(range(1, args.seeds + 1)),
           'latencies': latencies, 'lags': lags, 'results': results,
           'elapsed_s': round(time.time() - started, 1)}
    outdir = REPO / 'bench' / 'results' / args.name
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / 'results.json').write_text(json.dumps(doc, indent=1) + '\n')
    (outdir / 'results.md').write_text(report(doc))
    sys.stdout.write(report(doc))


if __name__ == '__main__':
    main()
