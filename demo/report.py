#!/usr/bin/env python3
"""What demo.sh says about its measurements.  Every sentence is worded from
the numbers of this run: where a conversation lands depends on a hash of
the replicas' addresses, so a caption written in advance ("they spread
over the replicas") is true for some ports and false for others.

    report.py turns ROWS SECTION REPLICAS
        one section's requests (ROWS: a line per request, tab-separated:
        section, conversation, turn, replica, route, cached, prompt
        tokens), summed up; REPLICAS: how many there are
    report.py replay ROUND_ROBIN.json AFFINITY.json
        the two replays of the trace (bench/sim/replay.py's output)
    report.py status STATUS.json NAMES [ROUND_ROBIN.json AFFINITY.json]
            [--png FILE]
        the module's status page (affinity_status) trimmed, and bar charts
        of its routes per replica and of the replays' hit ratios, in plain
        text; with --png, the same charts as a picture when matplotlib is
        there.  NAMES: lines "listening replica-1 127.0.0.1:PORT", as the
        mock replicas print them.
"""

import json
import sys
import textwrap

WIDTH = 78
BAR = 40

# The routes of affinity_status, in three groups a newcomer can read: the
# request went where its conversation, prompt or stored response already
# was; it was placed anew; or it went elsewhere (spilled over the load
# bound, its replica failed, its stored response was lost).
HIT = ('session_hit', 'prefix_hit', 'response_hit')
NEW = ('session_new', 'prefix_new')
OTHER = ('session_moved', 'session_spill', 'fallback', 'response_lost')
MARKS = (('#', HIT), ('+', NEW), ('.', OTHER))


def say(text, indent='  '):
    """Prints text wrapped to WIDTH, each line indented."""
    print(textwrap.fill(text, WIDTH, initial_indent=indent,
                        subsequent_indent=indent))


def count(n, one, many=None):
    """'1 turn', '3 turns'."""
    return '%d %s' % (n, one if n == 1 else (many or one + 's'))


def share(part, whole, what=' prompt tokens'):
    """'3,200 of 4,143 prompt tokens (77%)'."""
    percent = ' (%d%%)' % round(100.0 * part / whole) if whole else ''
    return '{:,} of {:,}{}{}'.format(part, whole, what, percent)


def tally(items, sep=': '):
    """'replica-2: 6, replica-3: 3', most first, then by name."""
    counts = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ', '.join('%s%s%d' % (k, sep, n) for k, n in ordered), \
        len(counts)


# ---------------------------------------------------------------------------
# turns: a section of single requests

def turns(rows_path, section, replicas):
    conversations = {}
    with open(rows_path) as rows:
        for line in rows:
            fields = line.rstrip('\n').split('\t')
            if len(fields) != 7 or fields[0] != section:
                continue
            _, name, turn, replica, route, cached, prompt = fields
            conversations.setdefault(name, []).append(
                (int(turn), replica, route, int(cached), int(prompt)))
    if not conversations:
        say('Measured: no request of this section got an answer.')
        return

    requests = [r for rows in conversations.values() for r in rows]
    used, nused = tally(r[1] for r in requests)
    text = ['Measured: %s, %s, on %d of %d replicas (%s).' % (
        count(len(conversations), 'conversation'),
        count(len(requests), 'request'), nused, int(replicas), used)]

    # Each conversation: on one replica, or on which ones, in order.
    places = []
    for name, rows in conversations.items():
        rows.sort()
        seen = []
        for row in rows:
            if not seen or seen[-1] != row[1]:
                seen.append(row[1])
        if len(seen) == 1:
            every = 'both' if len(rows) == 2 else 'all %d' % len(rows)
            places.append('%s: %s turns on %s' % (name, every, seen[0]))
        else:
            places.append('%s: turns on %s' % (name, ' then '.join(seen)))
    text.append('%s.' % '; '.join(places))

    # From the second turn on: did each turn find its previous turn's
    # replica, and what did the cache give?
    stayed = later = 0
    cached = prompt = first_cached = first_prompt = 0
    for rows in conversations.values():
        for before, row in zip(rows, rows[1:]):
            later += 1
            stayed += before[1] == row[1]
            cached += row[3]
            prompt += row[4]
        first_cached += rows[0][3]
        first_prompt += rows[0][4]
    if later:
        text.append('%d of %d later turns went to the replica of the turn'
                    ' before; later turns found %s in cache, first turns'
                    ' %s.' % (stayed, later, share(cached, prompt),
                             share(first_cached, first_prompt, '')))
    else:
        text.append('They found %s in cache.'
                    % share(first_cached, first_prompt))
    routes, _ = tally((r[2] for r in requests), ' ')
    text.append('Routes ($affinity_route): %s.' % routes)
    say(' '.join(text))


# ---------------------------------------------------------------------------
# replay: the two policies over the trace

def summary(path):
    try:
        with open(path) as f:
            return json.load(f)['summary']
    except (OSError, ValueError, KeyError):
        return None


def replay(rr_path, affinity_path):
    rr, affinity = summary(rr_path), summary(affinity_path)
    if not rr or not affinity:
        return
    if rr['hit_ratio'] > 0:
        times = affinity['hit_ratio'] / rr['hit_ratio']
        text = ['Measured: through the module, %.2f times round robin\'s'
                ' cache hit ratio (%.3f against %.3f).'
                % (times, affinity['hit_ratio'], rr['hit_ratio'])]
    else:
        text = ['Measured: cache hit ratio %.3f through the module, %.3f'
                ' through round robin.'
                % (affinity['hit_ratio'], rr['hit_ratio'])]
    ttft = [s.get('ttft_trace_s') or {} for s in (affinity, rr)]
    if all(t.get('p50') is not None and t.get('p90') is not None
           for t in ttft):
        text.append('Time to first token: p50 %.2f s against %.2f s, p90'
                    ' %.2f s against %.2f s.'
                    % (ttft[0]['p50'], ttft[1]['p50'], ttft[0]['p90'],
                       ttft[1]['p90']))
    for label, s in (('round robin', rr), ('the module', affinity)):
        per = s.get('replica_requests') or {}
        if per:
            text.append('Requests per replica, %s: %s.' % (label, ', '.join(
                '%s %d' % (name, per[name]) for name in sorted(per))))
    say(' '.join(text))


# ---------------------------------------------------------------------------
# status: the module's own figures, trimmed, and the charts

def names(path):
    """{'127.0.0.1:PORT': 'replica-1', ...} from the mock's output."""
    found = {}
    with open(path) as lines:
        for line in lines:
            words = line.split()
            if len(words) == 3 and words[0] == 'listening':
                found[words[2]] = words[1]
    return found


def trim(status, replica_names):
    """The upstream 'llm' with its peers (named as the replicas), the
    routes that happened, and how full each zone is."""
    upstream = status['upstreams']['llm']
    peers = []
    for peer in upstream['peers']:
        peers.append({
            'replica': replica_names.get(peer['name'], peer['name']),
            'name': peer['name'],
            'inflight': peer['inflight'],
            'requests': peer['requests'],
            'pins': peer['pins'],
            'routes': {k: v for k, v in peer['routes'].items() if v},
        })
    zones = {}
    for kind, zone in upstream['zones'].items():
        zones[kind] = {k: zone[k]
                       for k in ('entries', 'capacity', 'evictions')}
    return {'upstreams': {'llm': {
        'balance': upstream['balance'],
        'peers': peers,
        'routes': {k: v for k, v in upstream['routes'].items() if v},
        'zones': zones,
    }}}


def dump(value, indent=0, column=0):
    """JSON indented by 2, for a terminal of WIDTH columns (printed
    indented by 2 more): an object or array that fits on the rest of its
    line stays there; else its members go below it, as many to a line as
    fit.  indent: that of the value's line; column: where the value
    starts."""
    limit = WIDTH - 2
    flat = json.dumps(value)
    if not isinstance(value, (dict, list)) or not value \
            or column + len(flat) + 1 <= limit:
        return flat
    pad = ' ' * (indent + 2)
    if isinstance(value, dict):
        members = [(json.dumps(key) + ': ', item)
                   for key, item in value.items()]
        brackets = '{}'
    else:
        members = [('', item) for item in value]
        brackets = '[]'
    lines = []
    line = ''
    for head, item in members:
        part = head + dump(item, indent + 2, len(pad) + len(head))
        if '\n' not in part and line \
                and len(pad) + len(line) + 2 + len(part) + 1 <= limit:
            line += ', ' + part
            continue
        if line:
            lines.append(line)
        line = part
        if '\n' in part:
            lines.append(part)
            line = ''
    if line:
        lines.append(line)
    return '%s\n%s\n%s%s' % (brackets[0],
                             ',\n'.join(pad + line for line in lines),
                             ' ' * indent, brackets[1])


def bar(parts, scale):
    """'###++.    ': (mark, n) parts as one bar, whose length is their sum
    over scale times BAR characters; each part that is not 0 gets a mark
    at least, taken from the longest, so that no kind of route that
    happened is hidden by rounding."""
    total = sum(n for _, n in parts)
    length = round(BAR * total / scale) if scale else 0
    widths = [round(length * n / total) if total else 0 for _, n in parts]
    for k, (_, n) in enumerate(parts):
        if n and not widths[k]:
            widths[k] = 1
    while sum(widths) > length and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    while sum(widths) < length:
        widths[widths.index(max(widths))] += 1
    return ''.join(mark * w for (mark, _), w in zip(parts, widths)).ljust(BAR)


def route_chart(peers):
    print('  Requests the module sent to each replica, by how they were'
          ' routed:')
    print('    # to where its conversation, prompt or response already was'
          ' (*_hit)')
    print('    + placed anew (session_new, prefix_new)')
    print('    . elsewhere (spilled over the load bound, failed over, lost)')
    print()
    print('  %-12s %-*s  requests  #' % ('', BAR, ''))
    rows = []
    for peer in peers:
        routes = peer['routes']
        parts = [(mark, sum(routes.get(k, 0) for k in group))
                 for mark, group in MARKS]
        rows.append((peer['replica'], parts, sum(n for _, n in parts)))
    scale = max([total for _, _, total in rows] + [1])
    for replica, parts, total in rows:
        hits = parts[0][1]
        print('  %-12s|%s| %8d  %d' % (replica, bar(parts, scale), total,
                                         hits))
    total = sum(t for _, _, t in rows)
    hits = sum(parts[0][1] for _, parts, _ in rows)
    busiest = max(t for _, _, t in rows)
    print()
    say('Measured: %s on %d of %d replicas, the busiest with %d (%d%% of'
        ' them);'
        ' %d%% went to where their conversation, prompt or response'
        ' already was.' % (
            count(total, 'request'), sum(1 for r in rows if r[2]),
            len(rows), busiest,
            round(100.0 * busiest / total) if total else 0,
            round(100.0 * hits / total) if total else 0))
    return rows


def ratio_chart(rr, affinity):
    policies = [('round robin', rr['hit_ratio']),
                ('module', affinity['hit_ratio'])]
    print('  Cache hit ratio of the trace replay (prompt tokens served'
          ' from cache):')
    print()
    scale = max(ratio for _, ratio in policies) or 1
    for label, ratio in policies:
        print('  %-12s|%s| %.3f' % (label, bar([('#', ratio)], scale),
                                     ratio))
    return policies


def png(path, rows, policies):
    """The two charts as a picture; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = 2 if policies else 1
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6),
                                squeeze=False)
    ax = axes[0][0]
    labels = [replica for replica, _, _ in rows]
    bottom = [0] * len(rows)
    legend = ('where it already was (hit)', 'placed anew', 'elsewhere')
    for k, colour in enumerate(('tab:green', 'tab:blue', 'tab:orange')):
        heights = [parts[k][1] for _, parts, _ in rows]
        ax.bar(labels, heights, bottom=bottom, color=colour, label=legend[k])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_title('Requests per replica (affinity_status)')
    ax.legend(fontsize='small')
    if policies:
        ax = axes[0][1]
        ax.bar([p for p, _ in policies], [r for _, r in policies],
               color=('tab:gray', 'tab:green'))
        ax.set_title('Cache hit ratio, trace replay')
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def status(argv):
    picture = None
    if '--png' in argv:
        at = argv.index('--png')
        picture = argv[at + 1]
        del argv[at:at + 2]
    with open(argv[0]) as f:
        trimmed = trim(json.load(f), names(argv[1]))
    print(textwrap.indent(dump(trimmed), '  '))
    print()
    rows = route_chart(trimmed['upstreams']['llm']['peers'])
    policies = None
    if len(argv) >= 4:
        rr, affinity = summary(argv[2]), summary(argv[3])
        if rr and affinity:
            print()
            policies = ratio_chart(rr, affinity)
    if picture:
        print()
        if png(picture, rows, policies):
            print('  The same as a picture: %s' % picture)
        else:
            print('  (no picture: python3-matplotlib is not installed)')


def main(argv):
    if len(argv) == 4 and argv[0] == 'turns':
        turns(*argv[1:])
    elif len(argv) == 3 and argv[0] == 'replay':
        replay(*argv[1:])
    elif len(argv) >= 3 and argv[0] == 'status':
        status(argv[1:])
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:           # Ctrl-C: demo.sh says so
        sys.exit(130)
