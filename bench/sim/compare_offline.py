#!/usr/bin/env python3
"""Compares two builds of the core offline, from bounds.py's outputs.

Each directory holds one JSON file per run, named PROFILE-WORKLOAD-SEED.json
and written by

    bench/sim/bounds.py --profile PROFILE --workload WORKLOAD --seed SEED \\
        --size full --sessions both \\
        --policies oracle,soonest_oracle,module_session_prefix_cache \\
        --output DIR/PROFILE-WORKLOAD-SEED.json

with AFFINITY_CORE_LIB naming the build.  Prints a markdown table: for each
profile, workload and session mode, the new build against the base (hits,
mean and percentile TTFT, each the median over the seeds of the per-seed
ratios, the range in brackets) and the new build against the oracle.

    bench/sim/compare_offline.py BASE_DIR NEW_DIR
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ''):       # run as a file
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from bench import stamp  # noqa: E402

POLICY = 'module_session_prefix_cache'


def runs(directory):
    """{(profile, workload, sessions): {seed: figures}} of a directory."""
    out = {}
    for path in sorted(Path(directory).glob('*.json')):
        profile, rest = path.stem.split('-', 1)
        workload, seed = rest.rsplit('-', 1)
        doc = json.loads(path.read_text())
        commit = doc.get('stamp', {}).get('commit')
        for sessions, policies in doc['by_sessions'].items():
            m, o = policies[POLICY], policies['oracle']
            out.setdefault((profile, workload, sessions), {})[seed] = {
                'hits': m['hit_ratio'], 'oracle_hits': o['hit_ratio'],
                'mean': m['ttft_s']['mean'], 'p50': m['ttft_s']['p50'],
                'p90': m['ttft_s']['p90'], 'p99': m['ttft_s']['p99'],
                'oracle_p99': o['ttft_s']['p99'],
                'peak': m['peak_inflight_max'] - o['peak_inflight_max'],
            }
            if commit:
                out[(profile, workload, sessions)].setdefault(
                    '_commits', set()).add(commit)
    return out


def cell(values, digits=2):
    """The median of values, and their range when they differ."""
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    if round(lo, digits) == round(hi, digits):
        return f'{med:.{digits}f}'
    return f'{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('base')
    ap.add_argument('new')
    args = ap.parse_args()
    base, new = runs(args.base), runs(args.new)

    print(stamp.markdown(stamp.stamp()))
    print()
    for name, runs_of in (('base', base), ('new', new)):
        commits = sorted({c for v in runs_of.values() for c in v.get('_commits', ())})
        if commits:
            print(f'- {name}: runs stamped at commit {", ".join(commits)}')
    print()
    print('| profile | workload | ids | hits | mean | p50 | p90 | p99 '
          '| hits / oracle | p99 / oracle | peak − oracle |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for key in sorted(new):
        if key not in base:
            continue
        seeds = sorted((set(new[key]) & set(base[key])) - {'_commits'})
        n = [new[key][s] for s in seeds]
        b = [base[key][s] for s in seeds]

        def ratio(field):
            return cell([x[field] / y[field] if y[field] else 1.0
                         for x, y in zip(n, b)])

        profile, workload, sessions = key
        print(f'| {profile} | {workload} | {sessions} | {ratio("hits")} '
              f'| {ratio("mean")} | {ratio("p50")} | {ratio("p90")} '
              f'| {ratio("p99")} '
              f'| {cell([x["hits"] / x["oracle_hits"] for x in n])} '
              f'| {cell([x["p99"] / x["oracle_p99"] for x in n])} '
              f'| {cell([x["peak"] for x in n], 0)} |')


if __name__ == '__main__':
    main()
