#!/usr/bin/python3
"""Offline bounds for a request trace on the modelled fleet: the hit ratio
of an unbounded shared cache, the prefix-aware oracle router under the
load bound, and simple policies to cross-check replays against the mock.

    /usr/bin/python3 scripts/bounds.py --trace PATH [--limit N] \\
        [--replicas 4] [--factor 1.25] [--cache-tokens 262144] ...

Prints one JSON document (see llmsim/bounds.py for the model).  Figures
are in trace time: TTFTs are trace seconds, as the replay tool reports
them after scaling by its speed.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from llmsim import bounds, model, trace

DEFAULT_TRACE = (Path(__file__).resolve().parent.parent / '..' / 'shared'
                 / 'traces' / 'mooncake-fast25' / 'conversation_trace.jsonl')


def parse_args(argv=None):
    defaults = model.ReplicaParams()
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--trace', default=str(DEFAULT_TRACE),
                   help='JSON Lines trace (default: the shared Mooncake '
                        'conversation trace next to the repository)')
    p.add_argument('--limit', type=int, help='use at most N records')
    p.add_argument('--start', type=int, default=0,
                   help='first record to use (default 0)')
    p.add_argument('--replicas', type=int, default=4)
    p.add_argument('--factor', type=float, default=bounds.DEFAULT_FACTOR,
                   help='load bound factor (default %(default)s)')
    p.add_argument('--slack', type=float, default=bounds.DEFAULT_SLACK,
                   help='load bound slack in requests (default %(default)s)')
    p.add_argument('--ring-points', type=int, default=bounds.RING_POINTS,
                   help='consistent-hash points per replica')
    p.add_argument('--max-running', type=int, default=defaults.max_running)
    p.add_argument('--prefill-ms-per-token', type=float,
                   default=defaults.prefill_ms_per_token)
    p.add_argument('--decode-ms-per-token', type=float,
                   default=defaults.decode_ms_per_token)
    p.add_argument('--cache-tokens', type=int, default=defaults.cache_tokens,
                   help='prefix cache capacity per replica, in tokens')
    p.add_argument('--policies', default=','.join(bounds.POLICIES),
                   help='comma-separated, from: %s' % ', '.join(
                       bounds.POLICIES))
    p.add_argument('--output', help='write the JSON here instead of stdout')
    args = p.parse_args(argv)
    unknown = set(args.policies.split(',')) - set(bounds.POLICIES)
    if unknown:
        p.error('unknown policies: %s' % ', '.join(sorted(unknown)))
    return args


def replica_params(args):
    """Replica parameters in trace time (time_scale 1)."""
    return model.ReplicaParams(
        max_running=args.max_running,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        cache_tokens=args.cache_tokens,
        time_scale=1.0)


def timed(runtimes, name, fn, *a, **kw):
    """fn(*a, **kw), recording its wall time in runtimes[name]."""
    t0 = time.perf_counter()
    result = fn(*a, **kw)
    runtimes[name] = round(time.perf_counter() - t0, 3)
    return result


def compute(args):
    """The result document."""
    runtimes = {}
    records = timed(runtimes, 'load', trace.load_trace, args.trace,
                    args.limit, args.start)
    requests = timed(runtimes, 'chains', bounds.prepare_requests, records,
                     args.start)
    params = replica_params(args)
    doc = {
        'trace': Path(args.trace).name,
        'records': len(records),
        'start': args.start,
        'replicas': args.replicas,
        'factor': args.factor,
        'slack': args.slack,
        'params': asdict(params),
        'infinite_cache': timed(runtimes, 'infinite_cache',
                                bounds.infinite_cache, requests),
    }
    doc['infinite_cache_hit_ratio'] = doc['infinite_cache']['hit_ratio']
    doc['policies'] = {}
    for name in args.policies.split(','):
        summary, _ = timed(runtimes, name, bounds.simulate, requests, name,
                           args.replicas, params, args.factor, args.slack,
                           args.ring_points)
        if name == 'oracle':
            doc['oracle'] = summary
        else:
            doc['policies'][name] = summary
    doc['runtime_s'] = runtimes
    return doc


def main(argv=None):
    args = parse_args(argv)
    doc = compute(args)
    text = json.dumps(doc, indent=2)
    if args.output:
        Path(args.output).write_text(text + '\n')
    else:
        sys.stdout.write(text + '\n')


if __name__ == '__main__':
    main()
