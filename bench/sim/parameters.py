#!/usr/bin/python3
"""The module's load bound (affinity_balance factor= slack=) against the
oracle at the default bound, on the offline fleet simulator (bounds.py):
the figures of the README's "Choosing parameters" load-bound table.

    /usr/bin/python3 bench/sim/parameters.py [--seeds 3] [--jobs 2]

For each workload (conversation, shared-docs, agentic, chat), seed
1..--seeds and bound (factor, slack) of the grid, it runs

    /usr/bin/python3 bench/sim/bounds.py --workload W --seed S \\
        --size quick --profile tight --sessions both --factor F --slack K \\
        --policies oracle,module_session_prefix,module_prefix

as a subprocess, at most --jobs at once, and reads its JSON document.  The
reference is the oracle of the run at the default bound (factor 1.25,
slack 2; bounds.py's defaults, which are the module's), the same for every
bound of the grid: the table asks what a bound costs or buys against the
best routing with the bound the module ships with, not against an oracle
held to the same bound.  Per seed and cell:

    hits   module hit_ratio / oracle hit_ratio
    ttft   module ttft_s.p50 / oracle ttft_s.p50
    peak   module peak_inflight_max - oracle peak_inflight_max

and each cell of the table is the median over the seeds of each of the
three.  Two rows per bound: "both, ids" is module_session_prefix (both
directives) with session ids sent (by_sessions.on), "prefix, no ids" is
module_prefix (prefix_affinity; alone) without them (by_sessions.off); the
oracle reads no session id, so it is the same in both modes.  A second
table gives the spread over the seeds, min-max of each figure.

The module policies run the module's core library (core_policy.py), found
as $AFFINITY_CORE_LIB when set, which the subprocesses inherit.  The
simulations are deterministic: the same library and arguments give the
same table.  Prints markdown on stdout, beginning with the run's command
line, commit, module version and date (bench/stamp.py), progress on
stderr.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ''):       # run as a file
    sys.path[0] = str(REPO)

from bench import stamp  # noqa: E402

BOUNDS = Path('bench') / 'sim' / 'bounds.py'

WORKLOADS = ('conversation', 'shared-docs', 'agentic', 'chat')
FACTORS = ('1.1', '1.25', '1.5', '2.0')
SLACKS = ('1', '2', '4')
DEFAULT_BOUND = ('1.25', '2')
POLICIES = 'oracle,module_session_prefix,module_prefix'
# (label, sessions mode, policy): the table's two rows per bound
ROWS = (('both, ids', 'on', 'module_session_prefix'),
        ('prefix, no ids', 'off', 'module_prefix'))


def command(workload, seed, factor, slack):
    """The bounds.py command line of one run (relative to the repo)."""
    return ['/usr/bin/python3', str(BOUNDS), '--workload', workload,
            '--seed', str(seed), '--size', 'quick', '--profile', 'tight',
            '--sessions', 'both', '--factor', factor, '--slack', slack,
            '--policies', POLICIES]


def run(key):
    """bounds.py's document for key = (workload, seed, factor, slack)."""
    done = subprocess.run(command(*key), cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError('%s failed (%d):\n%s' % (
            ' '.join(command(*key)), done.returncode, done.stderr))
    return json.loads(done.stdout)


def run_all(keys, jobs):
    """{key: document}, running at most `jobs` bounds.py at once."""
    docs = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for n, (key, doc) in enumerate(zip(keys, pool.map(run, keys)), 1):
            docs[key] = doc
            print('%d/%d %s seed %d, factor %s slack %s' % ((n, len(keys))
                                                            + key),
                  file=sys.stderr, flush=True)
    return docs


def figures(module, oracle):
    """(hits ratio, TTFT p50 ratio, peak difference) of a module summary
    against an oracle summary; a ratio is None when the oracle's is 0."""
    def ratio(a, b):
        return a / b if a is not None and b else None
    return (ratio(module['hit_ratio'], oracle['hit_ratio']),
            ratio(module['ttft_s']['p50'], oracle['ttft_s']['p50']),
            module['peak_inflight_max'] - oracle['peak_inflight_max'])


def collect(docs, workload, seeds, factor, slack, mode, policy):
    """The per-seed figures of one cell."""
    out = []
    for seed in seeds:
        oracle = docs[(workload, seed) + DEFAULT_BOUND]['by_sessions'][mode][
            'oracle']
        module = docs[(workload, seed, factor, slack)]['by_sessions'][mode][
            policy]
        out.append(figures(module, oracle))
    return out


def _ratio(value):
    return 'n/a' if value is None else '%.2f' % value


def _peak(value):
    return '%+d' % value if value == int(value) else '%+.1f' % value


def median_cell(per_seed):
    """'hits / ttft / peak', medians over the seeds."""
    out = []
    for i, fmt in enumerate((_ratio, _ratio, _peak)):
        values = [f[i] for f in per_seed if f[i] is not None]
        out.append(fmt(statistics.median(values)) if values else 'n/a')
    return ' / '.join(out)


def spread_cell(per_seed):
    """'hits min-max / ttft min-max / peak min..max' over the seeds."""
    out = []
    for i, fmt in enumerate((_ratio, _ratio, _peak)):
        values = [f[i] for f in per_seed if f[i] is not None]
        if not values:
            out.append('n/a')
            continue
        low, high = fmt(min(values)), fmt(max(values))
        out.append(low if low == high
                   else '%s%s%s' % (low, '..' if i == 2 else '-', high))
    return ' / '.join(out)


def table(docs, workloads, seeds, bounds, cell):
    lines = ['| factor, slack | policy | %s |' % ' | '.join(workloads),
             '|---|---|%s' % ('---:|' * len(workloads))]
    for factor, slack in bounds:
        for label, mode, policy in ROWS:
            cells = [cell(collect(docs, w, seeds, factor, slack, mode,
                                  policy))
                     for w in workloads]
            lines.append('| %s, %s | %s | %s |' % (
                factor, slack, label, ' | '.join(cells)))
    return '\n'.join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--seeds', type=int, default=3,
                   help='seeds 1..N per workload (default %(default)s)')
    p.add_argument('--jobs', type=int, default=2,
                   help='bounds.py runs at once (default %(default)s)')
    p.add_argument('--workloads', default=','.join(WORKLOADS),
                   help='comma-separated (default %(default)s)')
    p.add_argument('--factors', default=','.join(FACTORS),
                   help='comma-separated (default %(default)s)')
    p.add_argument('--slacks', default=','.join(SLACKS),
                   help='comma-separated (default %(default)s)')
    args = p.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        p.error('--seeds and --jobs must be at least 1')
    return args


def main(argv=None):
    args = parse_args(argv)
    stamped = stamp.stamp(program=__file__, argv=argv)
    workloads = args.workloads.split(',')
    seeds = range(1, args.seeds + 1)
    bounds = [(f, k) for f in args.factors.split(',')
              for k in args.slacks.split(',')]
    runs = set(bounds) | {DEFAULT_BOUND}
    keys = [(w, s) + b for w in workloads for s in seeds
            for b in sorted(runs, key=lambda b: (float(b[0]), float(b[1])))]
    t0 = time.perf_counter()
    docs = run_all(keys, args.jobs)
    wall = time.perf_counter() - t0
    print(stamp.markdown(stamped) + '\n')
    print('Each cell: hits / oracle, TTFT p50 / oracle, peak in-flight '
          '- oracle; the oracle at factor %s, slack %s; medians of seeds '
          '%d-%d.\n' % (DEFAULT_BOUND + (seeds[0], seeds[-1])))
    print(table(docs, workloads, seeds, bounds, median_cell))
    print('\nSpread over the seeds (min-max of each figure):\n')
    print(table(docs, workloads, seeds, bounds, spread_cell))
    print('\n%d bounds.py runs, %d at once, %.0f s.' % (len(keys), args.jobs,
                                                      wall))


if __name__ == '__main__':
    main()
