"""Tests of the benchmark driver's proxies (bench/bench.py).

    /usr/bin/python3 -m unittest discover -s t/sim -t .
"""

import contextlib
import io
import json
import os
import socket
import tempfile
import unittest
from pathlib import Path

from bench import bench
from bench.sim import replay
from t.sim import test_trace_replay as replay_tests

NGINX = os.environ.get('NGINX_BIN', '/usr/sbin/nginx')


def closed_port():
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class CellTest(unittest.TestCase):

    def test_a_median_between_two_counts_keeps_its_half(self):
        self.assertEqual(bench.signed_cell((-0.5, -1, 0)),
                         '-0.5 (-1 to +0)')
        self.assertEqual(bench.signed_cell((0, -1, 0)), '+0 (-1 to +0)')
        self.assertEqual(bench.signed_cell((2, 2, 2)), '+2')


class ArrivalsTest(unittest.TestCase):

    def test_spread_arrivals_reach_the_simulator_and_the_replay(self):
        # --arrivals spread goes to bounds.py and replay.py for the
        # conversation trace only, and both read the same times from it.
        args = bench.parse_args(['--profile', 'tight', '--workload',
                                 'conversation', '--size', 'quick',
                                 '--arrivals', 'spread'])
        profile = bench.selected_profiles(args)[0]
        given = bench.Case(profile, 'conversation', 2, args).workload_args()
        self.assertEqual(given[-2:], ['--arrivals', 'spread'])
        chat = bench.Case(profile, 'chat', 2, args).workload_args()
        self.assertNotIn('--arrivals', chat)
        from bench.sim import bounds, workloads
        simulated = workloads.from_args(bounds.parse_args(given))
        replayed = workloads.from_args(replay.parse_args(
            ['--url', 'http://127.0.0.1:1/'] + given))
        times = [(r.index, r.arrival) for r in simulated.requests]
        self.assertEqual(times, [(r.index, r.arrival)
                                 for r in replayed.requests])
        self.assertEqual(len({t for _, t in times}), len(times))
        ticked = workloads.from_args(bounds.parse_args(given[:-2]))
        self.assertLess(len({r.arrival for r in ticked.requests}),
                        len(times) / 4)
        # several instances are measured on spread arrivals unless told
        # otherwise; the other presets keep the trace's
        self.assertEqual(bench.parse_args(['--instances']).arrivals,
                         'spread')
        self.assertEqual(bench.parse_args(['--instances', '--arrivals',
                                           'trace']).arrivals, 'trace')
        self.assertEqual(bench.parse_args(['--quick']).arrivals, 'trace')


@unittest.skipUnless(os.access(NGINX, os.X_OK), 'needs nginx')
class OracleReplayProxyTest(unittest.TestCase):
    """The oracle_replay proxy: real nginx sends each request to the
    replica its X-Bench-Replica names."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.records = [replay_tests.record([0, k], 1000, 4 + k, 10 * k)
                        for k in range(4)]
        self.trace_path = Path(self.tmp.name) / 'trace.jsonl'
        self.trace_path.write_text(''.join(json.dumps(r) + '\n'
                                           for r in self.records))

    def replay_routed(self, routes):
        """Replays the records through a routed proxy in front of the
        fake fleet (0) and a dead replica (1), with routes {request index:
        replica}; returns the max_tokens of the requests the fleet
        received, and the replay's summary."""
        path = Path(self.tmp.name) / 'routes.json'
        path.write_text(json.dumps({str(i): r for i, r in routes.items()}))
        output = Path(self.tmp.name) / 'result.json'
        with replay_tests.FakeFleet() as fleet:
            port = closed_port()
            proxy = bench.Proxy(self.tmp.name, 'routed', '',
                                [fleet.port, closed_port()], None, NGINX,
                                port=port)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    replay.main([
                        '--url', f'http://127.0.0.1:{port}/v1/chat/'
                                 'completions',
                        '--trace', str(self.trace_path), '--speed', '2',
                        '--timeout', '10', '--routes', str(path),
                        '--output', str(output)])
            finally:
                proxy.stop()
            reached = sorted(b['max_tokens'] for _, _, b in fleet.received)
        return reached, json.loads(output.read_text())['summary']

    def test_each_request_reaches_the_replica_it_names(self):
        reached, summary = self.replay_routed({0: 0, 1: 1, 2: 0, 3: 1})
        # max_tokens is 4 + the request's index
        self.assertEqual(reached, [4, 6])
        self.assertEqual(summary['errors'], 2)

    def test_a_request_without_a_route_fails(self):
        # not sent to the first replica, the live one, by default
        reached, summary = self.replay_routed({1: 0})
        self.assertEqual(reached, [5])
        self.assertEqual(summary['errors'], 3)


if __name__ == '__main__':
    unittest.main()
