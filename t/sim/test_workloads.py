"""Tests of the workloads (bench/sim/workloads.py), the fleet profiles
(bench/sim/profiles.py), the offline simulator's support for them
(bench/sim/bounds.py) and the moved-sessions metric (trace.session_moves).

    /usr/bin/python3 -m unittest discover -s t/sim -t .
"""

import json
import random
import unittest
from collections import Counter, defaultdict

from bench.sim import bounds, model, profiles, trace, workloads
from bench.sim.mock_backend import chat_prompt


GENERATORS = dict(workloads.GENERATORS)


def small(name, seed=1):
    """A short window of a generated workload, for speed."""
    seconds = {'shared-docs': 120, 'agentic': 90, 'chat': 60,
               'long-mix': 60}[name]
    return GENERATORS[name](seed=seed, duration=seconds)


def by_session(workload):
    sessions = defaultdict(list)
    for req in workload.requests:
        sessions[req.session].append(req)
    return sessions


def is_prefix(short, long):
    return long[:len(short)] == short


class GeneratorTest(unittest.TestCase):

    def test_deterministic_per_seed(self):
        for name in ('shared-docs', 'agentic', 'chat', 'long-mix'):
            with self.subTest(workload=name):
                a, b, c = small(name, 1), small(name, 1), small(name, 2)
                self.assertEqual([(r.arrival, r.session, r.body_bytes())
                                  for r in a.requests],
                                 [(r.arrival, r.session, r.body_bytes())
                                  for r in b.requests])
                self.assertNotEqual([r.arrival for r in a.requests],
                                    [r.arrival for r in c.requests])

    def test_requests_are_ordered_and_numbered(self):
        for name in ('shared-docs', 'agentic', 'chat', 'long-mix'):
            w = small(name)
            arrivals = [r.arrival for r in w.requests]
            self.assertEqual(arrivals, sorted(arrivals))
            self.assertEqual([r.index for r in w.requests],
                             list(range(len(w.requests))))
            self.assertGreater(len(w.requests), 50)

    def test_rate_is_the_sources(self):
        # A window of a stationary stream of sessions: its mean rate is the
        # trace's it is taken from, within sampling noise.
        w = workloads.chat(seed=3, duration=600)
        self.assertAlmostEqual(len(w.requests) / 600,
                               workloads.AZURE_CONV_RATE, delta=1.5)

    def test_shared_docs_shape(self):
        w = workloads.shared_docs(seed=1, duration=300)
        lengths = w.params['document_chars']
        self.assertEqual(len(lengths), 16)
        self.assertTrue(all(5000 <= n <= 30000 for n in lengths))
        readers = Counter()
        sessions = by_session(w)
        for turns in sessions.values():
            first = turns[0].messages[1]['content']
            if turns[0].turn == 0:
                doc = first.split('\n\nQuestion: ')[0]
                readers[len(doc)] += 1
        # a few documents are each read by many sessions
        top = readers.most_common(3)
        self.assertTrue(all(count >= 20 for _, count in top), top)
        # follow-up turns keep the questions and answers before them
        followed = [t for t in sessions.values() if len(t) >= 2]
        self.assertGreater(len(followed), 20)
        for turns in followed:
            for before, after in zip(turns, turns[1:]):
                self.assertTrue(is_prefix(before.messages, after.messages))
                self.assertEqual(after.messages[len(before.messages)]['role'],
                                 'assistant')
                self.assertGreater(after.arrival, before.arrival - 1e-9)

    def test_agentic_shape(self):
        w = small('agentic')
        system = w.requests[0].messages[0]
        for req in w.requests:
            self.assertEqual(req.messages[0], system)
            self.assertEqual(req.body()['tools'], workloads.agent_tools())
        self.assertGreater(len(system['content']), 8000)
        bursts = 0
        for turns in by_session(w).values():
            self.assertLessEqual(len({r.turn for r in turns}), 24)
            first = turns[0]
            for a, b in zip(turns, turns[1:]):
                if b.turn == a.turn:
                    # siblings: sent within 10 ms, the same history
                    self.assertLess(b.arrival - a.arrival, 0.0101)
                    self.assertTrue(is_prefix(first.messages, b.messages))
                    self.assertEqual(len(b.messages),
                                     len(first.messages) + 1)
                    bursts += 1
                else:
                    first = b
                    self.assertEqual(b.messages[-2]['role'], 'assistant')
                    self.assertEqual(b.messages[-1]['role'], 'tool')
        self.assertGreater(bursts, 10)
        # tool calls are short
        outputs = sorted(r.output_tokens for r in w.requests)
        self.assertLess(outputs[len(outputs) // 2], 40)

    def test_chat_shape(self):
        w = small('chat')
        sessions = by_session(w)
        self.assertGreater(len(sessions), 100)
        for turns in sessions.values():
            self.assertLessEqual(turns[-1].turn, 19)
            for req in turns:
                self.assertEqual(req.messages[0], {
                    'role': 'system',
                    'content': workloads.LMCACHE_SYSTEM_PROMPT})
            for a, b in zip(turns, turns[1:]):
                self.assertEqual(b.turn, a.turn + 1)
                self.assertTrue(is_prefix(a.messages, b.messages))
                self.assertGreaterEqual(b.arrival, a.arrival)

    def test_long_mix_shape(self):
        # A few sessions open with a long prompt; every other message is
        # chat's, at most 4,096 tokens.
        w = workloads.long_mix(seed=1, duration=600)
        sessions = by_session(w)
        low, high = workloads.LONG_MIX_TOKENS
        chars = model.CHARS_PER_TOKEN
        long = [turns for turns in sessions.values()
                if len(turns[0].messages[1]['content']) >= low * chars]
        self.assertGreaterEqual(len(long), 3)
        self.assertLess(len(long), 0.05 * len(sessions))
        for turns in long:
            self.assertLessEqual(
                len(turns[0].messages[1]['content']), high * chars)
            self.assertLessEqual(turns[-1].turn, workloads.LONG_MIX_TURNS - 1)
        for turns in sessions.values():
            for a, b in zip(turns, turns[1:]):
                self.assertTrue(is_prefix(a.messages, b.messages))
                self.assertLessEqual(len(b.messages[-1]['content']),
                                     4096 * chars)

    def test_conversation_slices(self):
        a = workloads.conversation(seed=1, limit=50)
        b = workloads.conversation(seed=2, limit=50)
        self.assertEqual(a.params['start'], 0)
        self.assertEqual(b.params['start'], 50)
        self.assertEqual(a.requests[0].arrival, 0.0)
        record = a.requests[3].record
        self.assertEqual(a.requests[3].body(), trace.chat_body(record))
        self.assertEqual(a.requests[3].session,
                         trace.session_id(record, 3))

    def test_conversation_arrivals_spread_over_their_tick(self):
        ticked = workloads.conversation(seed=2, limit=300)
        spread = workloads.conversation(seed=2, limit=300,
                                        arrivals='spread')
        self.assertNotIn('arrivals', ticked.params)
        self.assertEqual(spread.params['arrivals'], 'spread')
        # the trace's ticks: many requests in the same millisecond
        times = [r.arrival for r in ticked.requests]
        self.assertLess(len(set(times)), len(times) / 4)
        ticks = sorted(set(times))
        # spread: the same requests, in order of their new times, each
        # within the tick it came in
        self.assertEqual(sorted(r.index for r in spread.requests),
                         [r.index for r in ticked.requests])
        arrivals = [r.arrival for r in spread.requests]
        self.assertEqual(arrivals, sorted(arrivals))
        self.assertEqual(len(set(arrivals)), len(arrivals))
        given = {r.index: r.arrival for r in ticked.requests}
        for req in spread.requests:
            tick = given[req.index]
            k = ticks.index(tick)
            end = ticks[k + 1] if k + 1 < len(ticks) else tick + 3.0
            self.assertTrue(tick <= req.arrival < end + 1e-6,
                            (req.index, tick, req.arrival))
        # the same seed, the same times; sessions and bodies unchanged
        again = workloads.conversation(seed=2, limit=300, arrivals='spread')
        self.assertEqual(arrivals, [r.arrival for r in again.requests])
        by_index = {r.index: r for r in ticked.requests}
        for req in spread.requests[:20]:
            self.assertEqual(req.session, by_index[req.index].session)
            self.assertEqual(req.body(), by_index[req.index].body())
        with self.assertRaises(ValueError):
            workloads.conversation(seed=2, limit=10, arrivals='poisson')

    def test_from_quantiles(self):
        rng = random.Random(5)
        table = ((0, 10), (50, 20), (100, 40))
        values = [workloads.from_quantiles(rng, table) for _ in range(4000)]
        self.assertTrue(all(10 <= v <= 40 for v in values))
        below = sum(v <= 20 for v in values) / len(values)
        self.assertAlmostEqual(below, 0.5, delta=0.05)


class ChainTest(unittest.TestCase):

    def test_mock_renders_tools_first(self):
        body = {'messages': [{'role': 'user', 'content': 'hi'}],
                'tools': [{'type': 'function', 'function': {'name': 'f'}}]}
        self.assertEqual(chat_prompt(body),
                         'tool\n{"type":"function","function":{"name":"f"}}'
                         '\nuser\nhi\n')

    def test_piece_chains_equal_block_chain(self):
        pieces = bounds.PieceChains()
        for name in ('shared-docs', 'agentic', 'chat'):
            w = small(name)
            for req in w.requests[::7][:40]:
                body = json.loads(req.body_bytes())
                text = chat_prompt(body)
                with self.subTest(workload=name, index=req.index):
                    self.assertEqual(
                        bounds.unpack_chain(pieces.packed(
                            req.prompt_pieces())),
                        model.block_chain(text))

    def test_prepared_tokens_are_the_mocks(self):
        w = small('agentic')
        prepared = bounds.prepare_workload(w, rate_multiplier=4)
        for req, sim in list(zip(w.requests, prepared))[:30]:
            text = chat_prompt(req.body())
            self.assertEqual(sim.prompt_tokens, model.prompt_tokens(text))
            self.assertEqual(sim.arrival, req.arrival / 4)
            self.assertEqual(sim.key, req.session)
        off = bounds.with_sessions(prepared, False)
        self.assertTrue(all(r.key is None for r in off))
        self.assertEqual([r.session for r in off],
                         [r.session for r in prepared])


class ProfileTest(unittest.TestCase):

    def test_tight_cache_is_a_quarter_of_the_blocks_over_8(self):
        tight = profiles.PROFILES['tight']
        self.assertEqual((tight.replicas, tight.max_running,
                          tight.rate_multiplier, tight.cache_share),
                         (8, 4, 1.2, 0.25))
        # 0.25 * 100000 / 8 = 3125 blocks of 16 tokens
        self.assertEqual(tight.replica_cache_tokens(100000), 50000)
        self.assertEqual(tight.replica_cache_tokens(10), 16)
        roomy = profiles.PROFILES['roomy']
        self.assertEqual(roomy.replica_cache_tokens(100000), 4194304)

    def test_distinct_blocks(self):
        # "user\n" + 4096 + "\n" characters: 64 full blocks; the second
        # record shares its first 32 (its first 2048-character block).
        records = [{'timestamp': 0, 'input_length': 1024, 'output_length': 1,
                    'hash_ids': [0, 1]},
                   {'timestamp': 0, 'input_length': 1024, 'output_length': 1,
                    'hash_ids': [0, 2]}]
        requests = bounds.prepare_requests(records)
        self.assertEqual(bounds.distinct_blocks(requests), 64 + 32)
        tight = profiles.PROFILES['tight']
        self.assertEqual(tight.replica_cache_tokens(96), 3 * 16)

    def test_options_override(self):
        args = bounds.parse_args(['--profile', 'tight', '--replicas', '4',
                                  '--rate-multiplier', '2'])
        p = args.fleet_profile
        self.assertEqual((p.replicas, p.max_running, p.rate_multiplier,
                          p.cache_share), (4, 4, 2.0, 0.25))
        p = bounds.parse_args(['--profile', 'tight', '--cache-tokens',
                               '1000']).fleet_profile
        self.assertEqual((p.cache_share, p.replica_cache_tokens(5)),
                         (None, 1000))
        p = bounds.parse_args([]).fleet_profile
        self.assertEqual((p.replicas, p.max_running, p.cache_tokens),
                         (4, 32, 262144))


class MovesTest(unittest.TestCase):

    def test_hand_made_example(self):
        # Session a: replicas 1, 1, 2 (a move at 70 s), 1 (a move at 130 s).
        # Session b: 3 at 10 s, 3 at 65 s, 1 at 80 s (a move at 80 s).
        # Session c: one request at 125 s.  Windows of 60 s from 0:
        # window 0 has a, b active; window 1 a, b; window 2 a, c.
        events = [('a', 0, 1), ('b', 10, 3), ('a', 30, 1), ('b', 65, 3),
                  ('a', 70, 2), ('b', 80, 1), ('c', 125, 2), ('a', 130, 1)]
        m = trace.session_moves(events)
        self.assertEqual(m['moves'], 3)
        self.assertEqual(m['sessions'], 3)
        self.assertEqual(m['sessions_moved'], 2)
        self.assertEqual(m['windows'], 3)
        self.assertEqual(m['active_session_windows'], 6)
        self.assertAlmostEqual(m['moves_per_min'], 3 / 6)
        # moved in a window: a and b in window 1, a in window 2
        self.assertAlmostEqual(m['moved_session_share_per_min'], 3 / 6)

    def test_order_and_ties(self):
        # Given out of order; equal times keep the order given.
        events = [('a', 5, 2), ('a', 0, 1), ('a', 5, 1)]
        m = trace.session_moves(events)
        self.assertEqual(m['moves'], 2)        # 1 -> 2 -> 1
        self.assertEqual(trace.session_moves([])['moves_per_min'], None)

    def test_simulator_reports_the_same(self):
        w = small('chat')
        requests = bounds.prepare_workload(w, 4)
        summary, jobs = bounds.simulate(requests, 'round_robin', 4)
        m = trace.session_moves((j.req.session, j.req.arrival, j.replica,
                                 j.could_stay) for j in jobs)
        self.assertEqual(summary['session_moves'], m)
        # round robin moves sessions whatever the load
        self.assertEqual(m['unforced_moves'], m['moves'])
        self.assertEqual(summary['moves_per_min'], m['moves_per_min'])
        pinned, _ = bounds.simulate(requests, 'chash_session', 4)
        self.assertEqual(pinned['session_moves']['moves'], 0)
        self.assertGreater(m['moves'], 0)


class SimulatorWorkloadTest(unittest.TestCase):

    def test_every_workload_on_the_tight_profile(self):
        for name in workloads.NAMES:
            args = ['--workload', name, '--profile', 'tight',
                    '--sessions', 'both',
                    '--policies', 'oracle,least_loaded,chash_session']
            if name == 'conversation':
                args += ['--limit', '150']
            else:
                args += ['--size', 'quick']
            with self.subTest(workload=name):
                if name != 'conversation':
                    # shorter than quick, for speed
                    original = workloads.GENERATORS[name]
                    workloads.GENERATORS[name] = \
                        lambda seed, size, _g=original, _n=name: small(_n,
                                                                       seed)
                try:
                    doc = bounds.compute(bounds.parse_args(args))
                finally:
                    if name != 'conversation':
                        workloads.GENERATORS[name] = original
                profile = doc['profile']
                self.assertEqual(profile['replica_cache_tokens'],
                                 int(0.25 * profile['distinct_blocks'] / 8)
                                 * 16)
                self.assertEqual(doc['params']['max_running'], 4)
                on, off = doc['by_sessions']['on'], doc['by_sessions']['off']
                self.assertIsNone(off['chash_session'])
                self.assertEqual(on['oracle'], off['oracle'])
                for summary in (on['oracle'], on['least_loaded'],
                                on['chash_session']):
                    self.assertGreaterEqual(summary['hit_ratio'], 0)
                    self.assertIn('p99', summary['ttft_s'])
                    self.assertIsNotNone(summary['moves_per_min'])
                self.assertEqual(on['chash_session']['moves_per_min'], 0)


if __name__ == '__main__':
    unittest.main()


class IdleWhileQueuedTest(unittest.TestCase):

    @staticmethod
    def served(choose):
        """Two replicas of one running slot each, 40 chat requests at four
        times their rate, each sent where choose(fleet) says."""
        fleet = bounds.Fleet(model.ReplicaParams(max_running=1), 2)
        requests = bounds.prepare_workload(small('chat'), 4)[:40]

        class Policy:
            @staticmethod
            def choose(req, chain, fleet):
                return choose(fleet)

        simulation = bounds.Simulation(fleet)
        simulation.run(requests, Policy())
        return simulation

    def test_a_replica_idle_while_another_queues_is_timed(self):
        one = self.served(lambda fleet: 0)
        self.assertGreater(one.idle_queued, 0)
        self.assertGreater(one.idle_queued_max, 0)
        self.assertLessEqual(one.idle_queued_max, one.idle_queued)
        shortest = self.served(
            lambda fleet: min((0, 1), key=fleet.inflight))
        self.assertLess(shortest.idle_queued, one.idle_queued / 4)

    def test_the_drain_after_the_last_arrival_is_not_counted(self):
        # Everything on replica 0: its queue outlasts the arrivals, while
        # replica 1 stays idle.  No routing can act once nothing arrives.
        one = self.served(lambda fleet: 0)
        requests = bounds.prepare_workload(small('chat'), 4)[:40]
        span = requests[-1].arrival - requests[0].arrival
        self.assertGreater(one.idle_queued, span / 2)
        self.assertLessEqual(one.idle_queued, span)

    def test_requests_routed_to_a_queue_meanwhile_are_counted(self):
        # All on replica 0 (one running slot): every request routed while
        # replica 1 idles waits there; sent to the idlest, next to none.
        one = self.served(lambda fleet: 0)
        self.assertGreater(one.idle_routed, 0)
        self.assertEqual(one.idle_routed_to_queue, one.idle_routed)
        shortest = self.served(
            lambda fleet: min((0, 1), key=fleet.inflight))
        self.assertLess(shortest.idle_routed_to_queue,
                        one.idle_routed_to_queue / 4)

    def test_the_summary_has_it(self):
        summary, _ = bounds.simulate(
            bounds.prepare_workload(small('chat'), 4)[:40], 'round_robin',
            2, model.ReplicaParams(max_running=1))
        self.assertIn('idle_while_queued_s', summary)
        self.assertLessEqual(summary['idle_while_queued_routed_to_queue'],
                             summary['idle_while_queued_routed'])
        self.assertLessEqual(summary['idle_while_queued_max_s'],
                             summary['idle_while_queued_s'])
