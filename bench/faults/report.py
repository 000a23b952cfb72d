#!/usr/bin/env python3
"""The report of a fault benchmark run, from its work directory.

    bench/faults/report.py WORKDIR [RESULTS_DIR] [--no-plot]

Reads meta.json, requests.jsonl, events.json, samples.jsonl,
final_status.json, error.log (and the sanitizer directory, if the run had
one) and writes faults.json, faults.md and faults-rss.png to RESULTS_DIR
(default: WORKDIR); faults.md and faults.json begin with the stamp of the
run (meta.json's: its command line, commit, module version and date).

Failed requests are sorted into
    dead_peer              502/504 whose tries ($upstream_addr) include a
                           backend that was down during the request, or a
                           streamed answer from that backend cut within a
                           second of its death
    lost_killed_worker     the connection closed without a (complete)
                           answer within a second after a worker, killed
                           with -9 while the request was in flight, died,
                           and the answer, if it began, came from that worker
    other                  everything else: should be none
"""

import collections
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(1, REPO)

from bench import stamp  # noqa: E402

CONN_ERRS = ('eof', 'reset', 'broken_pipe')


def load_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass        # a line cut by an interrupted run
    return out


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------

def outages(events, meta):
    """[(name, port, t_down, t_up)]"""
    out = []
    down = {}
    end = max([e['t'] for e in events] or [0])
    for e in events:
        if e['kind'] == 'backend_down':
            down[e['backend']] = (e['port'], e['t'])
        elif e['kind'] == 'backend_up' and e['backend'] in down:
            port, t = down.pop(e['backend'])
            out.append((e['backend'], port, t, e['t']))
    for name, (port, t) in down.items():
        out.append((name, port, t, end))
    return out


def classify(rec, outs, kills):
    """'ok', 'dead_peer', 'lost_killed_worker' or 'other'."""
    if rec['ok']:
        return 'ok'
    t0, t1 = rec['t0'], rec['t1']
    status, err = rec['status'], rec['err']
    cut = err in CONN_ERRS
    # a backend down while the request was in flight (with a second's
    # margin after it came back: nginx may still hold it as failed)
    for name, port, td, tu in outs:
        if t0 > tu + 1.0 or t1 < td - 0.2:
            continue
        if status in (502, 504) and not err and \
                ('127.0.0.1:%d' % port) in rec.get('upstream', ''):
            return 'dead_peer'
        # a stream from the backend, cut when it died
        if cut and status == 200 and rec.get('backend') == name and \
                td - 0.05 <= t1 <= td + 1.0:
            return 'dead_peer'
    # the connection closed within a second of a kill of its worker
    if cut:
        for pid, tk in kills:
            if t0 - 0.05 <= tk and tk - 0.05 <= t1 <= tk + 1.0 and \
                    rec.get('worker') in ('', str(pid)):
                return 'lost_killed_worker'
    return 'other'


def failure_kind(rec):
    if rec['err']:
        return '%s (%s)' % (rec['err'], rec['phase'] or '-')
    if rec['status'] != 200:
        return 'status %s' % rec['status']
    return 'body: %s' % rec['check']


# ---------------------------------------------------------------------------

SIGNAL_RE = re.compile(r'worker process (\d+) exited on signal (\d+)')
CODE_RE = re.compile(r'process (\d+) exited with (?:fatal )?code (\d+)')
LEVEL_RE = re.compile(r'^\S+ \S+ \[(\w+)\] \d+#\d+: (?:\*\d+ )?(.*)$')


def normalize(msg):
    """A log message with what varies run to run taken out: the client,
    numbers, and the checkout's own path (results are committed)."""
    msg = msg.replace(REPO + os.sep, '')
    msg = re.sub(r', client: .*$', '', msg)
    msg = re.sub(r'\d+', 'N', msg)
    return msg[:160]


def read_error_log(path, killed_pids):
    res = {'by_level': collections.Counter(), 'messages': collections.Counter(),
           'crashes': [], 'killed_by_us': 0, 'exit_codes': []}
    if not os.path.exists(path):
        return res
    with open(path, errors='replace') as f:
        for line in f:
            line = line.rstrip('\n')
            m = LEVEL_RE.match(line)
            if m:
                res['by_level'][m.group(1)] += 1
                res['messages']['[%s] %s' % (m.group(1),
                                             normalize(m.group(2)))] += 1
            s = SIGNAL_RE.search(line)
            if s:
                pid, sig = int(s.group(1)), int(s.group(2))
                if sig == 9 and pid in killed_pids:
                    res['killed_by_us'] += 1
                else:
                    res['crashes'].append(line)
            c = CODE_RE.search(line)
            if c and c.group(2) != '0':
                res['exit_codes'].append(line)
            if 'AddressSanitizer' in line or 'runtime error:' in line:
                res['crashes'].append(line)
    return res


def sanitizer_reports(d):
    out = []
    if d and os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if os.path.isfile(p) and os.path.getsize(p) > 0:
                with open(p, errors='replace') as f:
                    head = f.read(2000)
                out.append({'file': name, 'head': head})
    return out


# ---------------------------------------------------------------------------

def analyze(workdir):
    with open(os.path.join(workdir, 'meta.json')) as f:
        meta = json.load(f)
    recs = load_jsonl(os.path.join(workdir, 'requests.jsonl'))
    with open(os.path.join(workdir, 'events.json')) as f:
        events = json.load(f)
    samples = load_jsonl(os.path.join(workdir, 'samples.jsonl'))
    final = []
    fp = os.path.join(workdir, 'final_status.json')
    if os.path.exists(fp):
        with open(fp) as f:
            final = json.load(f)

    outs = outages(events, meta)
    kills = [(e['pid'], e['t']) for e in events if e['kind'] == 'kill_worker']
    reloads = [e for e in events if e['kind'] == 'reload']
    t_stop = next((e['t'] for e in events if e['kind'] == 'load_stop'), None)

    # -- requests ---------------------------------------------------------
    by_class = collections.OrderedDict()
    statuses = collections.Counter()
    fails = collections.Counter()
    other = []
    bad_routes = collections.Counter()
    for r in recs:
        cls = r['cls']
        group = 'bad' if cls.startswith('bad:') else cls
        c = by_class.setdefault(cls, collections.Counter())
        c['sent'] += 1
        key = str(r['status']) if r['status'] is not None else 'no response'
        if r['err'] and r['status'] is not None:
            key += ' (cut)'
        statuses[key] += 1
        kind = classify(r, outs, kills)
        c[kind] += 1
        if kind != 'ok':
            fails[kind] += 1
        if kind == 'other':
            other.append(r)
        if r['route']:
            c['route:' + r['route']] += 1
        if group in ('bad', 'corpus') and r['ok'] and r['route'] != 'fallback':
            bad_routes['%s %s -> %s' % (cls, r['sub'], r['route'])] += 1

    classes = {}
    for cls, c in by_class.items():
        classes[cls] = {
            'sent': c['sent'], 'ok': c['ok'],
            'dead_peer': c['dead_peer'],
            'lost_killed_worker': c['lost_killed_worker'],
            'other_failures': c['other'],
            'routes': {k[6:]: v for k, v in sorted(c.items())
                       if k.startswith('route:')}}

    bad_sent = sum(v['sent'] for k, v in classes.items()
                   if k.startswith('bad:') or k in ('corpus', 'keyed_bad'))
    bad_ok = sum(v['ok'] for k, v in classes.items()
                 if k.startswith('bad:') or k in ('corpus', 'keyed_bad'))
    bad_other = sum(v['other_failures'] for k, v in classes.items()
                    if k.startswith('bad:') or k in ('corpus', 'keyed_bad'))
    corpus_files = sorted({r['sub'] for r in recs if r['cls'] == 'corpus'})
    dur = (max(r['t1'] for r in recs) - min(r['t0'] for r in recs)) \
        if recs else 0

    # -- crashes ----------------------------------------------------------
    el = read_error_log(os.path.join(workdir, 'error.log'),
                        {pid for pid, _ in kills})
    san = sanitizer_reports(meta.get('sanitizer_dir'))

    # -- in-flight --------------------------------------------------------
    def peers_of(st):
        out = {}
        for u in st.get('upstreams', {}).values():
            for p in u.get('peers', []):
                out[p['name']] = {'inflight': p.get('inflight'),
                                  'requests': p.get('requests'),
                                  'failures': p.get('failures'),
                                  'counted': p.get('counted')}
        return out

    def zones_of(st):
        out = {}
        for u in st.get('upstreams', {}).values():
            for kind, z in u.get('zones', {}).items():
                out[kind] = {'name': z.get('name'), 'entries': z.get('entries'),
                             'evictions': z.get('evictions'),
                             'peer_slots': z.get('peer_slots'),
                             'peer_slots_missing':
                                 z.get('peer_slots_missing'),
                             'workers': z.get('workers')}
        return out

    final_reads = []
    for fr in final:
        st = fr['status']
        if 'error' in st:
            final_reads.append({'t': fr['t'], 'error': st['error']})
            continue
        peers = peers_of(st)
        final_reads.append({
            't': fr['t'],
            'inflight_sum': sum(p['inflight'] or 0 for p in peers.values()),
            'peers': peers, 'zones': zones_of(st)})
    last = final_reads[-1] if final_reads else {}
    # tries: the status counts every try; the client sees them in
    # X-Upstream, except for requests that got no answer header
    tries_seen = sum(len([a for a in r['upstream'].split(',') if a.strip()])
                     for r in recs if r.get('upstream'))
    no_header = sum(1 for r in recs if r['status'] is None)
    status_requests = sum(p['requests'] or 0
                          for p in last.get('peers', {}).values())
    end_workers = next((e['workers'] for e in events
                        if e['kind'] == 'final'), [])

    # status in-flight against the client's own in-flight, during the load
    excess = []
    status_errors = 0
    for s in samples:
        st = s['status']
        if 'error' in st:
            status_errors += 1
            continue
        infl = sum((v[0] or 0) for v in st['peers'].values())
        excess.append((s['t'], infl - s['client_inflight'], infl,
                       s['client_inflight']))
    # away from kills (the dead worker's requests are given back within
    # about a second) and after the load stopped
    calm = [x for x in excess
            if all(abs(x[0] - tk) > 3 for _, tk in kills)]
    after = [x for x in excess if t_stop is not None and x[0] > t_stop]
    rows_used = [(s['t'], (s['status'].get('zones') or {}))
                 for s in samples if 'error' not in s['status']]

    # -- RSS --------------------------------------------------------------
    series = []
    per_pid = collections.OrderedDict()
    for s in samples:
        cur = [w for w in s['workers'] if w['current']]
        for w in s['workers']:
            per_pid.setdefault(w['pid'], []).append((s['t'], w['rss'],
                                                      w['anon']))
        if not cur:
            continue
        series.append({
            't': s['t'], 'n': len(cur),
            'all': len(s['workers']),
            'rss_med': median(w['rss'] for w in cur),
            'rss_max': max(w['rss'] for w in cur),
            'anon_med': median(w['anon'] for w in cur),
            'anon_max': max(w['anon'] for w in cur),
            'master': s.get('master_rss'),
            'loadavg': s.get('loadavg')})
    rss = {}
    if series:
        first = next((x for x in series if x['n'] >= 4), series[0])
        lastp = series[-1]
        rss = {
            'start_median_kb': first['rss_med'],
            'max_median_kb': max(x['rss_med'] for x in series),
            'end_median_kb': lastp['rss_med'],
            'max_any_worker_kb': max(x['rss_max'] for x in series),
            'anon_start_median_kb': first['anon_med'],
            'anon_max_median_kb': max(x['anon_med'] for x in series),
            'anon_end_median_kb': lastp['anon_med'],
            'anon_max_any_worker_kb': max(x['anon_max'] for x in series),
            'master_start_kb': first['master'],
            'master_max_kb': max(x['master'] or 0 for x in series),
            'master_end_kb': lastp['master'],
            'workers_seen': len(per_pid),
        }
        # growth over each worker's own life (workers live until the next
        # reload or kill)
        growth = []
        for pid, pts in per_pid.items():
            if len(pts) >= 10:
                growth.append((pts[-1][2] or 0) - (pts[0][2] or 0))
        rss['anon_growth_per_worker_kb'] = {
            'workers': len(growth),
            'median': median(growth),
            'max': max(growth) if growth else None}
        # a timeline: about 12 points
        step = max(1, len(series) // 12)
        rss['timeline'] = [series[i] for i in range(0, len(series), step)]
        if rss['timeline'][-1] is not series[-1]:
            rss['timeline'].append(series[-1])
        loads = [x['loadavg'] for x in series if x['loadavg'] is not None]
        rss['loadavg_median'] = median(loads)

    summary = {
        'meta': meta,
        'load_seconds': round(dur, 1),
        'requests': {
            'sent': len(recs),
            'ok': sum(1 for r in recs if r['ok']),
            'per_second': round(len(recs) / dur, 1) if dur else None,
            'bytes_sent': sum(r['bytes'] for r in recs),
            'to_temp_file_location': sum(1 for r in recs
                                         if r['loc'] == 'file'),
            'bad_bodies_sent': bad_sent,
            'bad_bodies_ok': bad_ok,
            'bad_bodies_other_failures': bad_other,
            'corpus_files': len(corpus_files),
            'by_class': classes,
        },
        'responses_by_status': dict(sorted(statuses.items())),
        'failures': {
            'total': sum(fails.values()),
            'dead_peer': fails['dead_peer'],
            'lost_killed_worker': fails['lost_killed_worker'],
            'other': fails['other'],
            'other_by_kind': dict(collections.Counter(
                '%s: %s' % (r['cls'], failure_kind(r)) for r in other)),
            'other_sample': [{k: r.get(k) for k in
                              ('id', 'cls', 'sub', 'loc', 'bytes', 't0', 't1',
                               'status', 'err', 'phase', 'check', 'route',
                               'worker', 'backend', 'upstream')}
                             for r in other[:20]],
        },
        'bad_bodies_not_fallback': dict(sorted(
            (k, n) for k, n in bad_routes.items()
            if not k.startswith('corpus'))),
        'corpus_not_fallback': sum(n for k, n in bad_routes.items()
                                   if k.startswith('corpus')),
        'faults': {
            'reloads': len(reloads),
            'reload_failures': [e for e in reloads if e['rc'] != 0],
            'worker_kills': len(kills),
            'backend_outages': [[n, round(td, 1), round(tu, 1)]
                                for n, _, td, tu in outs],
        },
        'crashes': {
            'exited_on_signal_not_ours': el['crashes'],
            'killed_by_us_in_log': el['killed_by_us'],
            'exited_with_code': el['exit_codes'],
            'sanitizer_reports': san,
        },
        'error_log': {
            'by_level': dict(el['by_level']),
            'top_messages': el['messages'].most_common(25),
        },
        'inflight': {
            'leaked_after_load': last.get('inflight_sum'),
            'status_requests_total': status_requests,
            'tries_seen_by_client': tries_seen,
            'requests_without_answer': no_header,
            'final_reads': final_reads,
            'workers_at_end': end_workers,
            'status_read_errors': status_errors,
            'excess_over_client_max': max((x[1] for x in excess),
                                          default=None),
            'excess_over_client_max_away_from_kills':
                max((x[1] for x in calm), default=None),
            'samples_with_excess_away_from_kills':
                sum(1 for x in calm if x[1] > 0),
            'samples': len(excess),
            'after_load_max': max((x[2] for x in after), default=None),
            'zone_workers_timeline': rows_used[::max(1, len(rows_used) // 12)],
        },
        'rss': rss,
    }
    return summary


def clean(s):
    return (s['failures']['other'] == 0
            and not s['crashes']['exited_on_signal_not_ours']
            and not s['crashes']['sanitizer_reports']
            and s['inflight']['leaked_after_load'] == 0)


# ---------------------------------------------------------------------------

def mb(kb):
    return '-' if kb is None else '%.1f' % (kb / 1024.0)


def markdown(s):
    m = s['meta']
    r = s['requests']
    f = s['failures']
    c = s['crashes']
    i = s['inflight']
    rss = s['rss']
    mach = m.get('machine', {})
    out = []
    w = out.append
    w('# Fault and soak benchmark')
    w('')
    if m.get('stamp'):
        w(stamp.markdown(m['stamp']))
        w('')
    w('`%s`%s — %s, nginx %s, module `%s` (sha1 %s), git HEAD %s%s.'
      % (m['command'],
         (' with ' + ' '.join('%s=%s' % kv for kv in m['env'].items()))
         if m['env'] else '',
         m['started'], m['nginx_version'].split('/')[-1], m['module'],
         m['module_sha1'][:12], m['git_head'],
         ' (uncommitted changes in: %s)' % ', '.join(
             x[3:] for x in m['git_dirty']) if m['git_dirty']
         else ', no uncommitted changes in src/'))
    w('')
    w('**Machine:** %s CPUs (%s), shared: load average %s before the run '
      '(busiest: %s), median %.2f during it. The load is kept moderate '
      '(%d client connections, most requests wait on backend delays) so '
      'that the other jobs keep their core.'
      % (mach.get('cpus'), mach.get('cpu', '?'),
         ' '.join(mach.get('loadavg_before', [])),
         '; '.join(mach.get('busiest_before', [])[:2]),
         rss.get('loadavg_median') or 0, m['concurrency']))
    cpu = m.get('cpu')
    if cpu and cpu['wall_s']:
        w('This run used %.2f cores on average over its %.0f s: %.2f for '
          'the driver (Python client, sampler), %.2f for nginx and the '
          'Python backends.'
          % ((cpu['driver_s'] + cpu['nginx_and_backends_s']) / cpu['wall_s'],
             cpu['wall_s'], cpu['driver_s'] / cpu['wall_s'],
             cpu['nginx_and_backends_s'] / cpu['wall_s']))
    w('')
    w('**Set-up:** nginx, %d workers; upstream of %d backends '
      '(`bench/faults/backend.py`) with `session_affinity header=X-Session-ID '
      'field=prompt_cache_key field=metadata.session_id`, `prefix_affinity`, '
      '`affinity_balance factor=1.25 slack=2`, `keepalive 16`, '
      '`max_fails=1 fail_timeout=5s`; `affinity_status` on its own port. '
      'Two locations: `client_body_buffer_size 1m` and `16k` (bodies over '
      '16 KB go to temporary files). Every client request is a new '
      'connection.' % (m['workers'], m['backends']))
    w('')
    fa = s['faults']
    w('**Faults over %.0f s of load:** `nginx -s reload` every %g s (%d, '
      '%d failed); `kill -9` of a random current worker every %g s (%d); '
      'one backend killed and restarted %g s later every %g s (%d outages).'
      ' Then the load stopped and the run settled %d s before the status '
      'was read.'
      % (s['load_seconds'], m['reload_every'], fa['reloads'],
         len(fa['reload_failures']), m['kill_every'], fa['worker_kills'],
         m['backend_down'], m['backend_cycle'], len(fa['backend_outages']),
         m['settle']))
    w('')
    w('## Verdict')
    w('')
    w('| check | result |')
    w('|---|---|')
    w('| failures not explained by a dead peer or a killed worker | **%d** |'
      % f['other'])
    w('| worker crashes (exited on a signal we did not send) | **%d** |'
      % len(c['exited_on_signal_not_ours']))
    if m.get('sanitizer_dir'):
        w('| sanitizer reports | **%d** |' % len(c['sanitizer_reports']))
    w('| in-flight left in the status after the load (sum over peers) | '
      '**%s** |' % i['leaked_after_load'])
    w('| bad and corpus bodies served normally (200, body intact) | %d of '
      '%d (%s) |'
      % (r['bad_bodies_ok'], r['bad_bodies_sent'],
         'the others: dead peer or killed worker'
         if not r['bad_bodies_other_failures'] else
         '**%d other failures**' % r['bad_bodies_other_failures']))
    w('| worker VmRSS, median of current workers: start / max / end | '
      '%s / %s / %s MB (start: before the zones are touched) |'
      % (mb(rss.get('start_median_kb')), mb(rss.get('max_median_kb')),
         mb(rss.get('end_median_kb'))))
    w('| worker RssAnon (private memory), median: start / max / end | '
      '%s / %s / %s MB |' % (mb(rss.get('anon_start_median_kb')),
                             mb(rss.get('anon_max_median_kb')),
                             mb(rss.get('anon_end_median_kb'))))
    w('')
    w('## Requests')
    w('')
    w('%d requests in %.0f s (%.0f/s), %.0f MB of bodies; %d to the 16k '
      'location. Every response was checked: status 200 and the backend\'s '
      'echo of the body\'s length and SHA-1.'
      % (r['sent'], s['load_seconds'], r['per_second'] or 0,
         r['bytes_sent'] / 1e6, r['to_temp_file_location']))
    w('')
    w('| class | sent | ok | dead peer | lost with a killed worker | other '
      'failures | routes |')
    w('|---|---:|---:|---:|---:|---:|---|')
    for cls, v in r['by_class'].items():
        routes = ', '.join('%s %d' % kv for kv in v['routes'].items())
        w('| %s | %d | %d | %d | %d | %d | %s |'
          % (cls, v['sent'], v['ok'], v['dead_peer'], v['lost_killed_worker'],
             v['other_failures'], routes))
    w('')
    w('Bad classes are keyless (`keyed_bad`: the same bodies with an '
      'X-Session-ID); `corpus`: the %d files of `fuzz/corpus/` that hold '
      'bodies (all of fuzz_prompt, the bodies of fuzz_field).'
      % r['corpus_files'])
    nf = s['bad_bodies_not_fallback']
    ncorpus = s.get('corpus_not_fallback', 0)
    if nf or ncorpus:
        bad = list(nf.items())
        w('')
        w('Served normally but routed by a prompt or a key rather than '
          '`fallback` (the module read a prompt: these bodies are valid '
          'JSON, or hold one; or a content type naming json, or none, '
          'which the module accepts by design): '
          + '; '.join('`%s` %d' % kv for kv in bad)
          + ('; corpus files %d times' % ncorpus if ncorpus else '') + '.')
    w('')
    w('**Responses by status:** ' + ', '.join(
        '%s: %d' % kv for kv in s['responses_by_status'].items()) +
      ' ("cut": the status line came, the body did not end).')
    w('')
    w('**Failed requests:** %d — dead peer %d, lost with a killed worker %d, '
      'other %d.' % (f['total'], f['dead_peer'], f['lost_killed_worker'],
                     f['other']))
    if f['other']:
        w('')
        w('Other failures by kind: ' + '; '.join(
            '%s: %d' % kv for kv in f['other_by_kind'].items()) + '.')
        w('')
        w('| id | class | sub | loc | bytes | t0 | t1 | status | error | '
          'check | route | worker | upstream |')
        w('|---|---|---|---|---:|---:|---:|---|---|---|---|---|---|')
        for x in f['other_sample'][:12]:
            w('| %s | %s | %s | %s | %s | %s | %s | %s | %s %s | %s | %s | '
              '%s | %s |' % (x['id'], x['cls'], x['sub'], x['loc'],
                             x['bytes'], x['t0'], x['t1'], x['status'],
                             x['err'], x['phase'], x['check'], x['route'],
                             x['worker'], x['upstream']))
    w('')
    w('## Crashes and the error log')
    w('')
    w('"exited on signal" lines: %d for our own `kill -9`, %d others.'
      % (c['killed_by_us_in_log'], len(c['exited_on_signal_not_ours'])))
    for line in c['exited_on_signal_not_ours'][:10]:
        w('    ' + line)
    if c['exited_with_code']:
        w('Non-zero exits: %d' % len(c['exited_with_code']))
        for line in c['exited_with_code'][:5]:
            w('    ' + line)
    if m.get('sanitizer_dir'):
        w('Sanitizer reports in %s: %d.' % (m['sanitizer_dir'],
                                            len(c['sanitizer_reports'])))
    w('')
    w('error.log lines by level: ' + ', '.join(
        '%s %d' % kv for kv in sorted(s['error_log']['by_level'].items())))
    w('')
    w('| count | message (numbers as N) |')
    w('|---:|---|')
    for msg, n in s['error_log']['top_messages'][:15]:
        w('| %d | `%s` |' % (n, msg.replace('|', '\\|')))
    w('')
    w('## In-flight')
    w('')
    for fr in i['final_reads']:
        if 'error' in fr:
            w('- status at %.0f s: %s' % (fr['t'], fr['error']))
            continue
        w('- status at %.0f s (load stopped, nothing in flight at the '
          'client): in-flight sum **%d**; per peer %s'
          % (fr['t'], fr['inflight_sum'], ', '.join(
              '%s %s' % (k.split(':')[-1], v['inflight'])
              for k, v in fr['peers'].items())))
    if i['final_reads'] and 'zones' in i['final_reads'][-1]:
        for kind, z in i['final_reads'][-1]['zones'].items():
            w('- zone %s `%s`: workers %s; entries %s, evictions %s, peer '
              'slots %s (missing %s)'
              % (kind, z['name'], json.dumps(z['workers']), z['entries'],
                 z['evictions'], z['peer_slots'], z['peer_slots_missing']))
    w('- live workers at the end: %d' % len(i['workers_at_end']))
    w('- tries counted by the status (sum of the peers\' `requests`): %d; '
      'tries the client saw in `X-Upstream`: %d, plus %d requests that '
      'got no answer, whose tries it could not see'
      % (i['status_requests_total'], i['tries_seen_by_client'],
         i['requests_without_answer']))
    if i['final_reads'] and 'zones' in i['final_reads'][-1]:
        rec = [z['workers'].get('inflight_recovered')
               for z in i['final_reads'][-1]['zones'].values()
               if z.get('workers')]
        w('- requests given back from killed workers (inflight_recovered, '
          'largest over the zones): %s, against %d requests the client lost '
          'with a killed worker (a request is counted in flight only once '
          'it has been sent to a peer, so the two need not match exactly)'
          % (max(rec) if rec else '-', s['failures']['lost_killed_worker']))
    w('- during the load, status in-flight minus the client\'s own in-flight '
      '(1 s samples, %d): max %s; away from kills (±3 s) max %s, %d samples '
      'above 0. The status rounds a negative count up to 0, so only '
      'counts that were never released show here.'
      % (i['samples'], i['excess_over_client_max'],
         i['excess_over_client_max_away_from_kills'],
         i['samples_with_excess_away_from_kills']))
    w('')
    w('## Worker memory')
    w('')
    if rss:
        w('VmRSS includes the shared zones as they are touched (RssShmem); '
          'RssAnon is the private heap. Medians over the current workers '
          '(not those shutting down after a reload) of each 1 s sample. '
          'Workers live until the next reload or kill, %d in all.'
          % rss['workers_seen'])
        w('')
        w('| | start | max | end |')
        w('|---|---:|---:|---:|')
        w('| VmRSS median (MB) | %s | %s | %s |'
          % (mb(rss['start_median_kb']), mb(rss['max_median_kb']),
             mb(rss['end_median_kb'])))
        w('| RssAnon median (MB) | %s | %s | %s |'
          % (mb(rss['anon_start_median_kb']), mb(rss['anon_max_median_kb']),
             mb(rss['anon_end_median_kb'])))
        w('| VmRSS of the busiest worker (MB) | | %s | |'
          % mb(rss['max_any_worker_kb']))
        w('| master VmRSS (MB) | %s | %s | %s |'
          % (mb(rss['master_start_kb']), mb(rss['master_max_kb']),
             mb(rss['master_end_kb'])))
        g = rss['anon_growth_per_worker_kb']
        w('')
        w('RssAnon growth over a worker\'s life (workers sampled 10 times or '
          'more: %d): median %s kB, max %s kB.'
          % (g['workers'], g['median'], g['max']))
        w('')
        w('| t (s) | current workers | all workers | VmRSS median | VmRSS '
          'max | RssAnon median | master | load avg |')
        w('|---:|---:|---:|---:|---:|---:|---:|---:|')
        for x in rss['timeline']:
            w('| %.0f | %d | %d | %s | %s | %s | %s | %s |'
              % (x['t'], x['n'], x['all'], mb(x['rss_med']),
                 mb(x['rss_max']), mb(x['anon_med']), mb(x['master']),
                 x['loadavg']))
        if s.get('plot'):
            w('')
            w('![RSS over time](%s)' % s['plot'])
    w('')
    return '\n'.join(out)


def draw_plot(s, samples, events, path):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=80)
    byp = collections.defaultdict(list)
    for smp in samples:
        for wk in smp['workers']:
            byp[wk['pid']].append((smp['t'], wk['rss'] / 1024.0,
                                   wk['anon'] / 1024.0))
    for pid, pts in byp.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color='0.75',
                lw=0.6)
        ax.plot([p[0] for p in pts], [p[2] for p in pts], color='#f3c99b',
                lw=0.6)
    tl = [(smp['t'], median([wk['rss'] for wk in smp['workers']
                             if wk['current']]),
           median([wk['anon'] for wk in smp['workers'] if wk['current']]),
           smp.get('master_rss'))
          for smp in samples if any(wk['current'] for wk in smp['workers'])]
    ax.plot([x[0] for x in tl], [x[1] / 1024.0 for x in tl], color='k',
            lw=1.5, label='VmRSS, median of current workers')
    ax.plot([x[0] for x in tl], [x[2] / 1024.0 for x in tl],
            color='#d2691e', lw=1.5, label='RssAnon, median')
    ax.plot([x[0] for x in tl], [(x[3] or 0) / 1024.0 for x in tl],
            color='#1f77b4', lw=1, ls='--', label='master VmRSS')
    first = True
    for e in events:
        if e['kind'] == 'kill_worker':
            ax.axvline(e['t'], color='r', lw=0.6, alpha=0.6,
                       label='kill -9 worker' if first else None)
            first = False
    first = True
    for e in events:
        if e['kind'] == 'reload':
            ax.axvline(e['t'], color='g', lw=0.6, ls=':',
                       label='reload' if first else None)
            first = False
    first = True
    for name, port, td, tu in outages(events, None):
        ax.axvspan(td, tu, color='0.9', label='backend down'
                   if first else None)
        first = False
    ax.set_xlabel('seconds')
    ax.set_ylabel('MB')
    top = max([p[1] for pts in byp.values() for p in pts] or [1])
    ax.set_ylim(0, top * 1.4)
    ax.set_title('nginx workers\' memory under faults (thin: each worker)')
    ax.legend(loc='upper left', fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write(summary, workdir, results, plot=True):
    os.makedirs(results, exist_ok=True)
    png = os.path.join(results, 'faults-rss.png')
    if plot:
        samples = load_jsonl(os.path.join(workdir, 'samples.jsonl'))
        with open(os.path.join(workdir, 'events.json')) as f:
            events = json.load(f)
        if draw_plot(summary, samples, events, png):
            summary['plot'] = 'faults-rss.png'
    stamped = summary.get('meta', {}).get('stamp')
    with open(os.path.join(results, 'faults.json'), 'w') as f:
        json.dump(dict({'stamp': stamped} if stamped else {}, **summary), f,
                  indent=1)
        f.write('\n')
    with open(os.path.join(results, 'faults.md'), 'w') as f:
        f.write(markdown(summary))


def print_summary(s):
    r, f, c, i, rss = (s['requests'], s['failures'], s['crashes'],
                       s['inflight'], s['rss'])
    print('')
    print('requests: %d in %.0f s; ok %d' % (r['sent'], s['load_seconds'],
                                            r['ok']))
    for cls, v in r['by_class'].items():
        print('  %-22s sent %6d ok %6d dead-peer %4d killed-worker %4d '
              'other %d' % (cls, v['sent'], v['ok'], v['dead_peer'],
                            v['lost_killed_worker'], v['other_failures']))
    print('responses by status: %s' % s['responses_by_status'])
    print('failures: dead peer %d, lost with a killed worker %d, OTHER %d'
          % (f['dead_peer'], f['lost_killed_worker'], f['other']))
    for k, n in f['other_by_kind'].items():
        print('  other: %s: %d' % (k, n))
    print('crashes: %d (exited on signal 9 by our kills: %d)%s'
          % (len(c['exited_on_signal_not_ours']), c['killed_by_us_in_log'],
             ', sanitizer reports: %d' % len(c['sanitizer_reports'])
             if s['meta'].get('sanitizer_dir') else ''))
    print('in-flight after the load: %s; zones: %s'
          % (i['leaked_after_load'],
             {k: z['workers'] for k, z in
              (i['final_reads'][-1].get('zones') or {}).items()}
             if i['final_reads'] else '-'))
    if rss:
        print('worker VmRSS median: start %s, max %s, end %s MB; RssAnon '
              'median: start %s, max %s, end %s MB' % (
                  mb(rss['start_median_kb']), mb(rss['max_median_kb']),
                  mb(rss['end_median_kb']), mb(rss['anon_start_median_kb']),
                  mb(rss['anon_max_median_kb']),
                  mb(rss['anon_end_median_kb'])))
    print('verdict: %s' % ('clean' if clean(s) else 'NOT CLEAN'))


if __name__ == '__main__':
    argv = [a for a in sys.argv[1:] if a != '--no-plot']
    if not argv:
        sys.exit(__doc__)
    wd = argv[0]
    res = argv[1] if len(argv) > 1 else wd
    summ = analyze(wd)
    write(summ, wd, res, plot='--no-plot' not in sys.argv)
    print_summary(summ)
