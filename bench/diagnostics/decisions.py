#!/usr/bin/env python3
"""What several instances believed when a replica filled up.

Reads the traces of a replay through nginx instances that load the traced
build (scripts/build-module.sh --trace, README.md here): each instance's
error log, with a line per routing decision (the load it counted on every peer) and
per event of the shared state (an engine's report, another instance's
news, an own announcement read back), and the mock replicas' arrivals
and ends.  Prints

- how long after a decision the other instances heard of it, and the
  deciding instance read its own announcement back;
- how long after a decision its request reached the replica;
- for every request that found the replica at its peak (or at --at), the
  load its instance counted on that replica against the requests routed
  there, by every instance, and not yet ended (the "global" count), and
  what the difference was made of: requests other instances had routed
  that this one had not heard of yet, and requests on their way to the
  replica when its engine last reported (the report counted them out).

Decisions and arrivals are paired in order, replica by replica: two
requests that overtake each other on their way swap their pairs, which
moves a figure by one for them and leaves the sums as they are.

    bench/diagnostics/decisions.py build/bench/NAME MOCK_TRACE [--at N]
        [--timeline]
"""

import argparse
import bisect
import collections
import glob
import os
import statistics

# affinity_route_e (src/core/include/affinity_core.h), as $affinity_route
# names them.
ROUTES = ('none', 'session_hit', 'session_new', 'session_moved',
          'session_spill', 'fallback', 'prefix_hit', 'prefix_new',
          'response_hit', 'response_lost')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('workdir', help="bench.py's work directory of the run, "
                   'build/bench/NAME, with the instances\' proxy*/error.log')
    p.add_argument('mock_trace', help='the file AFFINITY_MOCK_TRACE named')
    p.add_argument('--at', type=int, default=0,
                   help='requests that found at least this many in flight '
                        '(default: the run\'s peak)')
    p.add_argument('--timeline', action='store_true',
                   help='print what happened around each of them')
    return p.parse_args(argv)


def quantiles(values):
    """p10, p50, p90 and p99 of seconds, in milliseconds."""
    values = sorted(values)
    if not values:
        return 'none'
    n = len(values)
    return ' '.join('p%d %.2f ms' % (p, values[min(n - 1, n * p // 100)]
                                     * 1000)
                    for p in (10, 50, 90, 99))


class Run:
    """The traces of one replay, by replica index (the upstream's order,
    the mock's replica-N is index N - 1)."""

    def __init__(self, workdir, mock_trace):
        self.arrivals = collections.defaultdict(list)   # (time, in flight)
        self.ends = collections.defaultdict(list)       # time
        for line in open(mock_trace):
            what, when, name, inflight = line.split()
            index = int(name.rsplit('-', 1)[1]) - 1
            if what == 'MA':
                self.arrivals[index].append((float(when), int(inflight)))
            else:
                self.ends[index].append(float(when))
        for index in self.ends:
            self.ends[index].sort()

        # decisions[index]: (time, instance, load, unheard, route)
        self.decisions = collections.defaultdict(list)
        self.slot_index = {}            # (instance, slot) -> index
        events = []
        logs = sorted(glob.glob(os.path.join(workdir, 'proxy*',
                                             'error.log')))
        for instance, path in enumerate(logs):
            for line in open(path, errors='replace'):
                f = line.split()
                if not f:
                    continue
                if f[0] == 'AFX':
                    self.decision(instance, f)
                elif f[0] in ('AFP', 'AFE', 'AFH'):
                    events.append((instance, f))
        self.instances = len(logs)
        self.polls = collections.defaultdict(list)      # (inst, index)
        self.news = collections.defaultdict(list)       # (inst, index)
        self.heard = collections.defaultdict(list)      # (inst, index)
        for instance, f in events:
            index = self.slot_index.get((instance, int(f[3])))
            if index is None:
                continue
            when = float(f[1])
            if f[0] == 'AFP':
                self.polls[(instance, index)].append(when)
            elif f[0] == 'AFE' and f[4] == '1':
                self.news[(instance, index)].append(when)
            elif f[0] == 'AFH':
                self.heard[(instance, index)].append(when)
        for d in self.decisions.values():
            d.sort()
        for table in (self.polls, self.news, self.heard):
            for key in table:
                table[key].sort()
        self.pair_news()

    def decision(self, instance, f):
        chosen = int(f[3][2:])
        peers = {}
        for field in f[7:]:
            head, values = field.split(':')
            index, slot = head.split('@')
            peers[int(index)] = [int(v) for v in values.split('/')]
            self.slot_index[(instance, int(slot))] = int(index)
        load, unheard = peers[chosen][0], peers[chosen][1]
        self.decisions[chosen].append(
            (float(f[1]), instance, load, unheard, int(f[4][2:])))

    def pair_news(self):
        """When each instance heard each decision: another's news comes in
        the stream's order, which is the order of the decisions."""
        self.heard_at = {}              # (time, by, at instance) -> time
        self.news_lag, self.own_lag = [], []
        for index, decisions in self.decisions.items():
            for at in range(self.instances):
                others = [d for d in decisions if d[1] != at]
                for d, when in zip(others, self.news[(at, index)]):
                    self.heard_at[(d[0], d[1], at)] = when
                    self.news_lag.append(when - d[0])
                own = [d for d in decisions if d[1] == at]
                self.own_lag += [when - d[0] for d, when in
                                 zip(own, self.heard[(at, index)])]

    def requests(self):
        """Each request: its decision, paired with its arrival, and what
        its instance did not count."""
        for index in sorted(self.arrivals):
            decisions = self.decisions[index]
            times = [d[0] for d in decisions]
            arrived = [a[0] for a in self.arrivals[index]]
            ends = self.ends[index]
            for (when, inflight), d in zip(self.arrivals[index], decisions):
                decided, instance = d[0], d[1]
                routed = (bisect.bisect_left(times, decided)
                          - bisect.bisect_left(ends, decided))
                unknown = sum(1 for e in decisions
                              if e[1] != instance and e[0] < decided
                              and self.heard_at.get((e[0], e[1], instance),
                                                    float('inf')) > decided)
                polls = self.polls[(instance, index)]
                k = bisect.bisect_left(polls, decided) - 1
                on_the_way = 0
                if k >= 0:
                    on_the_way = (bisect.bisect_left(times, polls[k])
                                  - bisect.bisect_left(arrived, polls[k]))
                yield {'index': index, 'arrived': when, 'inflight': inflight,
                       'decided': decided, 'instance': instance,
                       'load': d[2], 'route': d[4], 'routed': routed,
                       'unknown': unknown, 'on_the_way': max(on_the_way, 0)}

    def timeline(self, r, before=0.06):
        index, start = r['index'], r['decided'] - before
        end = r['arrived'] + 0.001
        rows = [(d[0], 'routed by instance %d, counted %d, unheard %d, %s'
                 % (d[1], d[2], d[3], ROUTES[d[4]]))
                for d in self.decisions[index] if start <= d[0] <= end]
        rows += [(t, '  arrived, %d in flight' % n)
                 for t, n in self.arrivals[index] if start <= t <= end]
        rows += [(t, '  ended') for t in self.ends[index] if start <= t <= end]
        for at in range(self.instances):
            for name, table in (('engine reported', self.polls),
                                ("heard another's", self.news),
                                ('read its own back', self.heard)):
                rows += [(t, '    instance %d %s' % (at, name))
                         for t in table[(at, index)] if start <= t <= end]
        for t, text in sorted(rows):
            print('%8.1f ms  %s' % ((t - r['decided']) * 1000, text))


def main(argv=None):
    args = parse_args(argv)
    run = Run(args.workdir, args.mock_trace)
    requests = list(run.requests())
    peak = max(r['inflight'] for r in requests)
    at = args.at or peak
    print('%d instances, %d requests, peak %d in flight'
          % (run.instances, len(requests), peak))
    print('other instances hear a decision:', quantiles(run.news_lag))
    print('its instance reads it back:', quantiles(run.own_lag))
    print('it reaches its replica:',
          quantiles([r['arrived'] - r['decided'] for r in requests]))
    print()
    print('| found in flight | requests | counted | routed, not ended | '
          'not heard of yet | on the way at the last report | routes |')
    print('|---:|---:|---:|---:|---:|---:|---|')
    for floor in sorted({1, max(1, at - 2), max(1, at - 1), at}):
        rows = [r for r in requests if r['inflight'] >= floor]
        routes = collections.Counter(r['route'] for r in rows)
        print('| %d or more | %d | %.2f | %.2f | %.2f | %.2f | %s |' % (
            floor, len(rows), statistics.mean(r['load'] for r in rows),
            statistics.mean(r['routed'] for r in rows),
            statistics.mean(r['unknown'] for r in rows),
            statistics.mean(r['on_the_way'] for r in rows),
            ', '.join('%s %d' % (ROUTES[k], n)
                      for k, n in routes.most_common(3))))
    if args.timeline:
        for r in requests:
            if r['inflight'] >= at:
                print('\nreplica %d: %d in flight; routed by instance %d, '
                      'which counted %d' % (r['index'], r['inflight'],
                                            r['instance'], r['load']))
                run.timeline(r)


if __name__ == '__main__':
    main()
