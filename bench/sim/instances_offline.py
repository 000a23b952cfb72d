#!/usr/bin/python3
"""Several instances of the module, offline: one, and four sharing a store
and the engines' figures (core_policy.Instances), on a workload of the
tight profile, with the store's messages reaching the other instances at
once or some milliseconds later, and the conversation trace's requests at
its own times (in ticks of 3 s) or each at a random moment of its tick.
What separates what sharing state loses from what the store's latency
loses, deterministically, in minutes.

    /usr/bin/python3 bench/sim/instances_offline.py [--workloads conversation]
        [--seeds 3] [--first-seed 1] [--latencies 0,0.01,0.1]
        [--name instances-offline] [--out DIR]
        [--read-lag 0] [--poll-lag 0] [--transit 0]
        [--instances 4] [--without none [--without announcements,...]]
    /usr/bin/python3 bench/sim/instances_offline.py --merge DIR/*/results.json
        --out DIR

writes build/bench/<name>/results.json and results.md, or DIR's, or with
RECORD=1 in the environment the committed bench/results/<name>/'s; each
begins with the run's command line, commit, module version and date
(bench/stamp.py).
Latencies are in seconds of profile time: the replay of bench.py runs 20
times faster than real time, so 0.01 s stands for a store 0.5 ms away.
--read-lag, --poll-lag and --transit are bounds.py's, the last two for one
instance too.

Ablations: --instances 2,4,8 runs that many instances sharing
(module_xN_shared), and each --without a variant leaving out those
mechanisms (core_policy.MECHANISMS: announcements, presumption, watch,
filled, levels, pin; 'none': everything shared, as the module does),
every variant against the same one instance, seed by seed (--spread
client: behind a front that keeps each session on one instance); results.md
then has one table, a row per workload, arrivals, sessions, instances and
latency, a column per variant.  --merge writes summary.md of such runs'
results.json together (columns also per front and per set of seeds).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ''):       # run as a file
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench import stamp  # noqa: E402
from bench.sim import bounds, workloads  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ONE = 'module_x1_metrics'
SHARED = 'module_x4_shared'
MECHANISMS = ('announcements', 'presumption', 'watch', 'filled', 'levels',
              'pin')      # core_policy.MECHANISMS, without loading ctypes


def simulate(requests, params, replicas, name, latency, lags, without=()):
    s, _ = bounds.simulate(requests, name, replicas, params,
                           store_latency=latency, without=without, **lags)
    return {'hit_ratio': s['hit_ratio'], 'ttft_p50': s['ttft_s']['p50'],
            'peak_inflight': s['peak_inflight_max']}


def variant_name(without):
    """'all' (everything shared), else '-' and the mechanisms left out."""
    return '-' + '-'.join(without) if without else 'all'


def label_of(count, without, latency):
    return 'x%d%s@%g' % (count, '' if not without
                         else variant_name(without), latency)


def case(workload, seed, arrivals, latencies, lags, shared=SHARED,
         counts=None, variants=((),), client=False):
    """Every figure of one workload slice: {sessions: {label: figures}}.
    With counts (instance counts), labels are label_of() of every count,
    variant (a tuple of mechanisms left out) and latency; without, the
    four instances of shared, 'four@LATENCY'.  client: the counts behind
    a front that keeps each session on one instance."""
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
        if counts is None:
            for latency in latencies:
                figures['four@%g' % latency] = simulate(
                    sent, params, profile.replicas, shared, latency, lags)
        else:
            for count in counts:
                policy = 'module_x%d_shared%s' % (count, '_client'
                                                  if client else '')
                for without in variants:
                    for latency in latencies:
                        figures[label_of(count, without, latency)] = \
                            simulate(sent, params, profile.replicas, policy,
                                     latency, lags, without)
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


def ratios(seeds, sessions, label):
    """Seed by seed: hits ÷ one's, TTFT p50 ÷ one's, peak − one's."""
    hits, ttft, peak = [], [], []
    for figures in seeds.values():
        one, many = figures[sessions]['one'], figures[sessions][label]
        hits.append(many['hit_ratio'] / one['hit_ratio'])
        ttft.append(many['ttft_p50'] / one['ttft_p50'])
        peak.append(many['peak_inflight'] - one['peak_inflight'])
    return hits, ttft, peak


# The targets: hits >= 0.97 one's, TTFT p50 <= 1.2 one's, peak <= one's + 1.
TARGETS = (0.97, 1.2, 1)


def mark(hits, ttft, peak):
    """'' when every seed meets the targets, ' ·' when the medians do but
    some seed does not, ' ✗' when a median does not."""
    median = statistics.median
    if (median(hits) < TARGETS[0] or median(ttft) > TARGETS[1]
            or median(peak) > TARGETS[2]):
        return ' ✗'
    if (min(hits) < TARGETS[0] or max(ttft) > TARGETS[1]
            or max(peak) > TARGETS[2]):
        return ' ·'
    return ''


def seeds_text(seeds):
    seeds = sorted(seeds)
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return '%d–%d' % (seeds[0], seeds[-1])
    return ', '.join(str(s) for s in seeds)


def ablation_table(docs):
    """One table over docs (ablation runs): a row per workload /
    arrivals / sessions / instances / latency, a column per variant (and
    per set of seeds, when the runs' differ: 'all, seeds 4–6')."""
    main = docs[0]['seeds']
    columns, rows = [], {}
    for doc in docs:
        for v in doc['variants']:
            column = variant_name(v)
            if doc['policy'].endswith('_client'):
                column += ', sessions kept on an instance'
            if doc['seeds'] != main:
                column += ', seeds ' + seeds_text(doc['seeds'])
            if column not in columns:
                columns.append(column)
            for workload, by_arrivals in doc['results'].items():
                for arrivals, by_seed in by_arrivals.items():
                    for sessions in ('on', 'off'):
                        for count in doc['counts']:
                            for latency in doc['latencies']:
                                h, t, p = ratios(by_seed, sessions,
                                                 label_of(count, v, latency))
                                rows.setdefault((workload, arrivals, sessions,
                                                 count, latency), {})[
                                    column] = '%s / %s / %s%s' % (
                                    ratio_cell(h), ratio_cell(t),
                                    signed_cell(p), mark(h, t, p))
    lines = ['| workload | arrivals | sessions | instances | latency | '
             + ' | '.join(columns) + ' |',
             '|---|---|---|---:|---:|' + '---|' * len(columns)]
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2] != 'on', -k[4],
                                           k[3])):
        lines.append('| %s | %s | %s | %d | %g | ' % key + ' | '.join(
            rows[key].get(c, '') for c in columns) + ' |')
    return main, lines


def ablation_report(docs, title, stamped=None):
    seeds, table = ablation_table(docs)
    stamped = stamped or docs[0].get('stamp')
    return '\n'.join(['# ' + title, '']
                     + ([stamp.markdown(stamped), ''] if stamped else [])
                     + [
                      'Offline (bench/sim/instances_offline.py), tight '
                      'profile, full size, seeds %s: N instances sharing a '
                      "store and the engines' figures (module_xN_shared), "
                      'with every mechanism (all) or without some (-...), '
                      "against one with the engines' figures "
                      "(module_x1_metrics), seed by seed: hits ÷ one's / "
                      "TTFT p50 ÷ one's / peak in-flight − one's, median "
                      '[min–max]; ✗: a median misses a target (hits ≥ '
                      "%.2f, TTFT p50 ≤ %.1f times, peak ≤ one's + %d), "
                      '·: the medians meet them, not every seed.  '
                      'Latency: seconds of profile time before what one '
                      'instance publishes reaches the others (0.02: a '
                      'store 1 ms away, replayed 20 times faster than real '
                      'time).' % (seeds_text(seeds), *TARGETS), '']
                     + table) + '\n'


def report(doc):
    if 'variants' in doc:
        return ablation_report([doc], doc['name'])
    lines = ['# ' + doc['name'], '']
    if doc.get('stamp'):
        lines += [stamp.markdown(doc['stamp']), '']
    lines += ['Offline (bench/sim/instances_offline.py), tight profile, '
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
    p.add_argument('--first-seed', type=int, default=1,
                   help='seeds FIRST.. FIRST + SEEDS - 1 (default 1)')
    p.add_argument('--out', help='where results go (default '
                   'build/bench/NAME, with RECORD=1 bench/results/NAME)')
    p.add_argument('--instances',
                   help='comma-separated instance counts sharing '
                        '(module_xN_shared), for ablations; with --without')
    p.add_argument('--without', action='append',
                   help='a variant: comma-separated mechanisms left out '
                        '(%s), or none; repeat for several (implies '
                        '--instances 4 unless given)' % ', '.join(MECHANISMS))
    p.add_argument('--merge', nargs='+', metavar='RESULTS_JSON',
                   help='write --out/summary.md of these ablation runs')
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
    stamped = stamp.stamp(program=__file__, argv=argv)
    if args.merge:
        if not args.out:
            p.error('--merge needs --out')
        docs = [json.loads(Path(f).read_text()) for f in args.merge]
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        text = ablation_report(docs, 'Ablation of what instances share',
                               stamped)
        (out / 'summary.md').write_text(text)
        sys.stdout.write(text)
        return
    counts = variants = None
    if args.instances or args.without:
        counts = [int(x) for x in (args.instances or '4').split(',')]
        variants = []
        for given in args.without or ['none']:
            names = tuple(x for x in given.split(',') if x and x != 'none')
            for x in names:
                if x not in MECHANISMS:
                    p.error('unknown mechanism %r' % x)
            variants.append(names)
    lags = {'read_lag': args.read_lag, 'poll_lag': args.poll_lag,
            'transit': args.transit}
    latencies = [float(x) for x in args.latencies.split(',')]
    names = args.workloads.split(',')
    for name in names:
        if name not in workloads.NAMES:
            p.error('unknown workload %r' % name)
    shared = SHARED + ('_client' if args.spread == 'client' else '')
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.time()
    results = {}
    for name in names:
        results[name] = {}
        for a in ('trace', 'spread') if name == 'conversation' \
                else ('trace',):
            results[name][a] = {}
            for seed in seeds:
                began = time.time()
                results[name][a][str(seed)] = case(name, seed, a,
                                                   latencies, lags, shared,
                                                   counts, variants or ((),),
                                                   args.spread == 'client')
                print('%s/%s/%d done in %.0f s' % (name, a, seed,
                                                   time.time() - began),
                      flush=True)
    doc = {'stamp': stamped, 'name': args.name, 'policy': shared,
           'seeds': seeds,
           'latencies': latencies, 'lags': lags, 'results': results,
           'elapsed_s': round(time.time() - started, 1)}
    if counts is not None:
        doc.update(policy='module_xN_shared' + (
            '_client' if args.spread == 'client' else ''), counts=counts,
                   variants=[list(v) for v in variants])
    outdir = Path(args.out) if args.out \
        else Path(stamp.results_path(args.name))
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / 'results.json').write_text(json.dumps(doc, indent=1) + '\n')
    (outdir / 'results.md').write_text(report(doc))
    sys.stdout.write(report(doc))


if __name__ == '__main__':
    main()
