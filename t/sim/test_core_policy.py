"""Tests of the module policies of the offline simulator
(bench/sim/core_policy.py): the module's C++ core, through ctypes, routing
the simulated fleet.  The core's shared library is the one make unit
built, or it is built in build/core/ (core_policy.library_path).

    /usr/bin/python3 -m unittest discover -s t/sim -t .
"""

import ctypes
import dataclasses
import os
import subprocess
import tempfile
import unittest
from collections import defaultdict

from bench.sim import bounds, core_policy, model, workloads

INCLUDE = os.path.join(os.path.dirname(__file__), '..', '..', 'src', 'core',
                       'include')


def advance(policy, until, fleet):
    """Runs the timers of an Instances policy due by until, as the
    simulation does between its events."""
    while policy.next_timer() <= until:
        policy.timer(policy.next_timer(), fleet)


def light_params():
    """A roomy fleet: the load bound never moves a session."""
    return model.ReplicaParams(max_running=32, cache_tokens=1 << 22)


def chat_slice():
    return workloads.chat(seed=4, duration=60)


def conversations(sessions=40, turns=4):
    """Sessions of growing chats whose turns come 20 s apart, one session
    starting every 3 s: at most a request or two in flight at a time."""
    placed = []
    for s in range(sessions):
        history = [{'role': 'system', 'content': 'Be brief.'}]
        for k in range(turns):
            history = history + [{'role': 'user', 'content':
                                  workloads.tokens_text('u%d-%d' % (s, k),
                                                        300)}]
            placed.append(workloads.Request(0, 3.0 * s + 20.0 * k,
                                            'conv-%d' % s, 16, history,
                                            turn=k))
            history = history + [{'role': 'assistant', 'content':
                                  workloads.tokens_text('a%d-%d' % (s, k),
                                                        16)}]
    placed.sort(key=lambda r: r.arrival)
    for i, req in enumerate(placed):
        req.index = i
    return workloads.Workload('conversations', 0, placed)


class ModulePolicyTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.lib = core_policy.library()
        cls.requests = bounds.prepare_workload(conversations())

    def replicas_by_session(self, jobs):
        placed = defaultdict(set)
        for job in jobs:
            placed[job.req.session].add(job.replica)
        return placed

    def test_same_session_same_replica_at_low_load(self):
        summary, jobs = bounds.simulate(self.requests, 'module_session', 4,
                                        light_params())
        self.assertLessEqual(summary['peak_inflight_max'], 2)
        placed = self.replicas_by_session(jobs)
        self.assertEqual(len(placed), 40)
        self.assertTrue(all(len(placed[s]) == 1 for s in placed))
        self.assertEqual(summary['session_moves']['moves'], 0)
        routes = summary['routes']
        self.assertEqual(routes['session_new'], len(placed))
        self.assertEqual(routes['session_hit'],
                         len(jobs) - len(placed))
        # every session placed somewhere: all four replicas used
        self.assertEqual(len({j.replica for j in jobs}), 4)

    def test_counters_follow_the_requests(self):
        policy = core_policy.make('module_session_prefix', 4)
        fleet_params = light_params()
        from bench.sim.fleet import Fleet
        fleet = Fleet(fleet_params, 4)
        sim = bounds.Simulation(fleet)
        # a chat slice at its own rate: requests overlap
        jobs = sim.run(bounds.prepare_workload(chat_slice()), policy)
        stats = policy.peer_stats()
        self.assertEqual([s['inflight'] for s in stats], [0, 0, 0, 0])
        self.assertEqual(sum(s['requests'] for s in stats), len(jobs))
        self.assertEqual([s['requests'] for s in stats],
                         [rep.counters['requests_total']
                          for rep in fleet.replicas])

    def test_prefix_follows_the_conversation_without_a_key(self):
        off = bounds.with_sessions(self.requests, False)
        summary, jobs = bounds.simulate(off, 'module_prefix', 4,
                                        light_params())
        placed = self.replicas_by_session(jobs)
        self.assertTrue(all(len(r) == 1 for r in placed.values()))
        self.assertGreater(summary['routes']['prefix_hit'], 0)
        # the session zone's policy has no key: least loaded (fallback)
        summary, _ = bounds.simulate(off, 'module_session', 4,
                                     light_params())
        self.assertEqual(summary['routes'], {'fallback': len(off)})

    def test_deterministic(self):
        first, _ = bounds.simulate(self.requests, 'module_session_prefix', 4,
                                   light_params())
        second, _ = bounds.simulate(self.requests, 'module_session_prefix',
                                    4, light_params())
        self.assertEqual(first, second)

    def test_turn_levels_are_kept_apart_per_policy(self):
        # Requests keep their levels between runs (req.memo): a policy
        # without turn levels must not read those of one with them.
        off = bounds.with_sessions(self.requests, False)
        with_turns, _ = bounds.simulate(off, 'module_prefix', 4,
                                        light_params())
        bounds.simulate(off, 'module_prefix_turns0', 4, light_params())
        again, _ = bounds.simulate(off, 'module_prefix', 4, light_params())
        self.assertEqual(with_turns, again)
        levels = core_policy.Level * core_policy.MAX_LEVELS
        memo = off[-1].memo
        self.assertEqual(sorted(memo), ['levels/0', 'levels/8'])
        turns = [lv.turn for lv in levels.from_buffer_copy(
            memo['levels/8'].ljust(ctypes.sizeof(levels), b'\0'))]
        self.assertIn(1, turns)
        turns0 = [lv.turn for lv in levels.from_buffer_copy(
            memo['levels/0'].ljust(ctypes.sizeof(levels), b'\0'))]
        self.assertNotIn(1, turns0)

    def test_instances_sharing_a_store_route_as_one(self):
        # Four instances behind a random spreader, with zones of their own,
        # on replicas of two running slots.  Without the store each
        # learns a quarter of the conversations and places the others'
        # next turns afresh; sharing it, with no latency, they route as
        # one instance does.
        off = bounds.with_sessions(self.requests, False)
        tight = model.ReplicaParams(max_running=2, cache_tokens=1 << 22)
        hits = {}
        for name in ('module_x1_metrics', 'module_x4_shared',
                     'module_x4_metrics'):
            summary, jobs = bounds.simulate(off, name, 4, tight)
            placed = self.replicas_by_session(jobs)
            hits[name] = summary['hit_ratio']
            moved = sum(len(r) > 1 for r in placed.values())
            if name == 'module_x4_metrics':
                self.assertGreater(moved, 10, name)
            else:
                self.assertEqual(moved, 0, name)
            self.assertEqual(sum(summary['routes'].values()), len(off))
        self.assertAlmostEqual(hits['module_x4_shared'],
                               hits['module_x1_metrics'], delta=0.01)
        self.assertLess(hits['module_x4_metrics'],
                        0.8 * hits['module_x1_metrics'])

    def test_instances_apply_what_the_others_publish(self):
        # One instance's decision, published with no latency, is applied
        # by the other: a conversation placed by A is a prefix hit on B.
        from bench.sim.fleet import Fleet
        policy = core_policy.Instances(4, 2, store=True, metrics=True)
        fleet = Fleet(light_params(), 4)
        seen = {}
        for req in bounds.with_sessions(self.requests, False):
            advance(policy, req.arrival, fleet)
            peer, token = policy.choose(req, req.chain(), fleet)
            seen.setdefault(req.session, []).append((token[0], peer))
            policy.release(token)
        # some conversation's turns went through both instances, and
        # stayed on one replica
        both = [v for v in seen.values() if len({k for k, _ in v}) == 2]
        self.assertTrue(both)
        self.assertTrue(all(len({p for _, p in v}) == 1 for v in both))
        # every instance counted every request's start and end: nothing
        # is left in flight anywhere
        for member in policy.members:
            self.assertEqual([s['inflight'] for s in member.peer_stats()],
                             [0, 0, 0, 0])

    def test_instances_learn_after_the_stores_latency(self):
        # A conversation's first turn through instance 0, its second
        # through instance 1: found there once the store's latency has
        # passed, not before.
        from bench.sim.fleet import Fleet

        class To:
            k = 0

            def randrange(self, n):
                return self.k

        off = bounds.with_sessions(self.requests, False)
        first = off[0]
        second = next(r for r in off if r.session == first.session
                      and r is not first)
        for gap, route in ((0.0005, 'prefix_new'), (0.002, 'prefix_hit')):
            policy = core_policy.Instances(4, 2, latency=0.001)
            policy.spread = To()
            fleet = Fleet(light_params(), 4)
            advance(policy, first.arrival, fleet)
            policy.choose(first, first.chain(), fleet)
            policy.spread.k = 1
            late = dataclasses.replace(second, arrival=first.arrival + gap)
            advance(policy, late.arrival, fleet)
            policy.choose(late, late.chain(), fleet)
            self.assertEqual(policy.members[1].stats()['routes'],
                             {route: 1}, gap)

    def test_instances_count_each_others_requests(self):
        # With the store and the engines' figures, an instance counts on a
        # peer's load the requests the other said it sent there, until it
        # says they ended (or the engine reports again).
        from bench.sim.fleet import Fleet

        class To:
            k = 0

            def randrange(self, n):
                return self.k

        policy = core_policy.Instances(4, 2, latency=0.001)
        policy.spread = To()
        fleet = Fleet(light_params(), 4)
        advance(policy, 1.5, fleet)        # both have polled an idle fleet
        off = bounds.with_sessions(self.requests, False)[:3]
        tokens = []
        for req in off:
            tokens.append(policy.choose(dataclasses.replace(req, arrival=1.5),
                                        req.chain(), fleet))
        advance(policy, 1.6, fleet)
        sent = [0] * 4
        for peer, _ in tokens:
            sent[peer] += 1
        other = policy.members[1]
        self.assertEqual([s['elsewhere'] for s in other.peer_stats()], sent)
        self.assertEqual([s['inflight'] for s in other.peer_stats()],
                         [0, 0, 0, 0])
        policy.at(1.7)
        for _, token in tokens:
            policy.release(token)
        advance(policy, 1.8, fleet)
        self.assertEqual([s['elsewhere'] for s in other.peer_stats()],
                         [0, 0, 0, 0])
        self.assertEqual([s['inflight'] for s in policy.peer_stats()],
                         [0, 0, 0, 0])

    def test_unheard_until_its_sender_reads_it_back(self):
        # The store takes a request's news at 1.501; the other instance
        # reads it at once, its sender 10 ms later (read_lag), and counts
        # it unheard until then.
        from bench.sim.fleet import Fleet

        class Lags:
            def __init__(self, lags):
                self.lags = list(lags)

            def uniform(self, low, high):
                return self.lags.pop(0)

        policy = core_policy.Instances(4, 2, latency=0.001, read_lag=0.01)
        policy.spread = type('To', (), {'randrange': lambda self, n: 0})()
        policy.lag = Lags([0.01, 0.0] * 4)
        fleet = Fleet(light_params(), 4)
        advance(policy, 1.5, fleet)
        req = bounds.with_sessions(self.requests, False)[0]
        peer, _ = policy.choose(dataclasses.replace(req, arrival=1.5),
                                req.chain(), fleet)
        sender, other = policy.members

        def figures(member, name):
            return [s[name] for s in member.peer_stats()]

        one = [int(p == peer) for p in range(4)]
        self.assertEqual(figures(sender, 'unheard'), one)
        advance(policy, 1.502, fleet)
        self.assertEqual(figures(other, 'elsewhere'), one)
        self.assertEqual(figures(sender, 'unheard'), one)
        advance(policy, 1.512, fleet)
        self.assertEqual(figures(sender, 'unheard'), [0, 0, 0, 0])

    def test_by_client_every_request_of_a_session_meets_one_instance(self):
        # bench.py's x4_shared_client: the front keeps each session on an
        # instance; at random, a session's requests meet several.
        from bench.sim.fleet import Fleet

        def instances_by_session(by_client):
            policy = core_policy.Instances(4, 4, by_client=by_client)
            met = defaultdict(set)
            for k, member in enumerate(policy.members):
                def choose(req, chain, fleet, k=k, routed=member.choose):
                    met[req.session].add(k)
                    return routed(req, chain, fleet)
                member.choose = choose
            fleet = Fleet(light_params(), 4)
            for req in self.requests:
                advance(policy, req.arrival, fleet)
                policy.choose(req, req.chain(), fleet)
            return met

        kept = instances_by_session(True)
        self.assertEqual({len(k) for k in kept.values()}, {1})
        self.assertEqual(len(set().union(*kept.values())), 4)
        spread = instances_by_session(False)
        self.assertGreater(max(len(k) for k in spread.values()), 1)

    def test_read_backs_teach_what_the_front_does(self):
        # Agent sessions' parallel calls, the store 10 ms away: behind a
        # front that keeps each session on an instance, what an instance
        # sends beside its unheard requests meets none of the others', and
        # each learns to presume none; at random, one per other instance.
        from bench.sim.fleet import Fleet
        requests = bounds.prepare_workload(
            workloads.agentic(seed=1, size='quick', duration=800))

        def presumed(by_client):
            policy = core_policy.Instances(8, 4, by_client=by_client,
                                           latency=0.01)
            fleet = Fleet(light_params(), 8)
            for req in requests:
                advance(policy, req.arrival, fleet)
                policy.choose(req, req.chain(), fleet)
            advance(policy, requests[-1].arrival + 1, fleet)
            now = core_policy.NOW_ORIGIN + int(requests[-1].arrival)
            return [m.unheard_presumed(now) for m in policy.members]

        for mean, learned in presumed(True):
            self.assertGreaterEqual(learned, 64)
            self.assertLess(mean, 0.15)
        for mean, learned in presumed(False):
            self.assertEqual(mean, 3.0)

    def test_engine_reports_applied_poll_lag_later(self):
        # A poll's figures are those of the moment it was made, applied
        # poll_lag later: what changed meanwhile is not in them.
        from bench.sim.fleet import Fleet
        fleet = Fleet(light_params(), 4)
        running = fleet.replicas[0].admission
        policy = core_policy.Instances(4, 1, interval=2.0, poll_lag=0.5)
        member = policy.members[0]
        running.in_use = 3
        advance(policy, 0.0, fleet)           # the engines report: 3
        running.in_use = 7
        advance(policy, 0.4, fleet)
        self.assertEqual(member.peer_stats()[0]['engine_load'], -1)  # none
        advance(policy, 0.5, fleet)
        self.assertEqual(member.peer_stats()[0]['engine_load'], 3)

    def test_a_burst_within_the_stores_latency(self):
        # 24 requests for one shared document at the same moment, spread
        # over two or four instances.  With no latency each counts the
        # others' on the peers' load and the burst is placed as one
        # instance places it; with a latency each instance bounds its
        # share of it on its own, and some peer gets more.
        from bench.sim.fleet import Fleet
        doc = workloads.tokens_text('document', 3000)
        placed = [workloads.Request(i, 0.0 if i == 0 else 30.0, 's%d' % i,
                                    16, [{'role': 'system', 'content': doc},
                                         {'role': 'user', 'content':
                                          'question %d' % i}])
                  for i in range(25)]
        requests = bounds.with_sessions(bounds.prepare_workload(
            workloads.Workload('burst', 0, placed)), False)

        def burst(count, latency):
            policy = core_policy.Instances(4, count, latency=latency)
            fleet = Fleet(model.ReplicaParams(max_running=64,
                                              cache_tokens=1 << 22), 4)
            jobs = bounds.Simulation(fleet).run(requests, policy)
            return sorted(j.replica for j in jobs[1:])

        one = burst(1, 0.0)
        most = max(one.count(r) for r in range(4))
        for count in (2, 4):
            self.assertEqual(burst(count, 0.0), one, count)
            blind = burst(count, 0.001)
            self.assertGreater(max(blind.count(r) for r in range(4)), most,
                               count)

    def test_without_leaves_each_mechanism_out(self):
        # Ablations (Instances(without=)): without announcements the other
        # instance counts none of A's requests, which stay unheard at A
        # until A reads them back; without the presumption no instance
        # learns that another routes; without the watch, nothing is
        # learned from read-backs; without filled, levels or pin, those
        # messages are not published.  Unknown names are refused.
        from bench.sim.fleet import Fleet
        off = bounds.with_sessions(self.requests, False)

        def burst(without):
            # as test_instances_count_each_others_requests
            policy = core_policy.Instances(4, 2, latency=0.001,
                                           without=without)
            policy.spread = type('To', (), {'randrange':
                                            lambda self, n: 0})()
            fleet = Fleet(light_params(), 4)
            advance(policy, 1.5, fleet)
            for req in off[:3]:
                policy.choose(dataclasses.replace(req, arrival=1.5),
                              req.chain(), fleet)
            sender, other = policy.members
            unheard = sum(s['unheard'] for s in sender.peer_stats())
            advance(policy, 1.6, fleet)
            return (unheard, sum(s['unheard'] for s in sender.peer_stats()),
                    sum(s['elsewhere'] for s in other.peer_stats()))

        self.assertEqual(burst(()), (3, 0, 3))
        self.assertEqual(burst(('announcements',)), (3, 0, 0))

        def run(without, requests, count=2, release=True):
            policy = core_policy.Instances(4, count, latency=0.01,
                                           without=without)
            published = defaultdict(int)
            publish = policy._publish

            def counted(origin, kind, *a):
                published[kind] += 1
                return publish(origin, kind, *a)
            policy._publish = counted
            fleet = Fleet(light_params(), 4)
            for req in requests:
                advance(policy, req.arrival, fleet)
                _, token = policy.choose(req, req.chain(), fleet)
                if release:
                    policy.release(token)
            advance(policy, requests[-1].arrival + 1, fleet)
            now = core_policy.NOW_ORIGIN + int(requests[-1].arrival)
            return policy, published, now

        _, published, _ = run(('announcements',), self.requests)
        self.assertEqual(published['done'], 0)
        for without in ('filled', 'levels', 'pin'):
            _, published, _ = run((without,), self.requests)
            self.assertEqual(published[without], 0, without)
            self.assertGreater(published['sent'], 0, without)
            self.assertGreater(published['done'], 0, without)
        _, published, _ = run((), self.requests)
        for kind in ('sent', 'done', 'filled', 'levels', 'pin'):
            self.assertGreater(published[kind], 0, kind)
        # at random, agent sessions teach one per other instance (as
        # test_read_backs_teach_what_the_front_does)
        agent = bounds.prepare_workload(
            workloads.agentic(seed=1, size='quick', duration=400))
        for without, mean, learns in (((), 3.0, True),
                                      (('presumption',), 0.0, False),
                                      (('watch',), 3.0, False)):
            policy, _, now = run(without, agent, 4, False)
            for member in policy.members:
                presumed, learned = member.unheard_presumed(now)
                self.assertEqual(presumed, mean, without)
                self.assertEqual(learned > 0, learns, without)
        with self.assertRaises(ValueError):
            core_policy.Instances(4, 2, without=('gossip',))
        self.assertEqual(core_policy.instance_policy('module_x8_shared'),
                         (8, True, True, False))

    def test_mixed_fleet_and_the_pace_its_replies_teach(self):
        """The mixed profile slows every other replica down; the core
        learns each replica's decode time from the simulated replies, the
        slowed ones' 2.5 times the others'."""
        from bench.sim import profiles
        mixed = profiles.PROFILES['mixed']
        self.assertEqual(mixed.slowdowns(), [1.0, 2.5] * 4)
        params = model.ReplicaParams(max_running=4, cache_tokens=1 << 20)
        fleet = bounds.Fleet(params, 4, slowdowns=[1, 2.5, 1, 2.5])
        self.assertEqual(fleet.replicas[1].params.decode_ms_per_token,
                         2.5 * params.decode_ms_per_token)
        self.assertEqual(fleet.replicas[2].params, params)

        policy = bounds.make_policy('module_session_prefix', 4)
        bounds.Simulation(fleet).run(self.requests, policy)
        lib = policy.lib
        decode = []
        for peer in policy.peers:
            pace = core_policy.PeerPace()
            lib.affinity_zone_peer_pace(policy.counter.handle, peer.slot,
                                        ctypes.byref(pace))
            self.assertGreater(pace.replies, 0)
            decode.append(pace.decode_us)
        for fast, slow in ((0, 1), (2, 3)):
            self.assertAlmostEqual(decode[slow] / decode[fast], 2.5,
                                   delta=0.2)

    def test_default_level_schedule(self):
        schedule = list(core_policy.level_schedule(self.lib))
        self.assertEqual(schedule[:4], [100, 500, 1000, 1256])
        self.assertTrue(30000 < schedule[-1] <= 32 * 1024)


if __name__ == '__main__':
    unittest.main()


class StructMirrorTest(unittest.TestCase):
    """Every ctypes mirror of a C API struct has the C struct's size: the
    core fills caller-owned structs whole, and a shorter mirror lets it
    overwrite whatever Python placed after it."""

    MIRRORS = {
        'affinity_peer_t': core_policy.Peer,
        'affinity_level_t': core_policy.Level,
        'affinity_balance_t': core_policy.Balance,
        'affinity_request_t': core_policy.RouteRequest,
        'affinity_decision_t': core_policy.Decision,
        'affinity_reply_times_t': core_policy.ReplyTimes,
        'affinity_peer_pace_t': core_policy.PeerPace,
        'affinity_engine_load_t': core_policy.EngineLoad,
        'affinity_engine_asked_t': core_policy.EngineAsked,
        'affinity_peer_stats_t': core_policy.PeerStats,
        'affinity_unheard_watch_t': core_policy.UnheardWatch,
        'affinity_zone_info_t': core_policy.ZoneInfo,
    }

    def c_sizes(self):
        lines = ''.join('    printf("%%s %%zu\\n", "%s", sizeof(%s));\n'
                        % (name, name) for name in self.MIRRORS)
        source = ('#include <stdio.h>\n#include "affinity_core.h"\n'
                  'int main(void)\n{\n%s    return 0;\n}\n' % lines)
        with tempfile.TemporaryDirectory() as directory:
            c_file = os.path.join(directory, 'sizes.c')
            program = os.path.join(directory, 'sizes')
            with open(c_file, 'w') as handle:
                handle.write(source)
            subprocess.run(['cc', '-I', INCLUDE, c_file, '-o', program],
                           check=True)
            out = subprocess.run([program], check=True, capture_output=True,
                                 text=True).stdout
        return {name: int(size) for name, size in
                (line.split() for line in out.splitlines())}

    def test_mirrors_have_the_c_sizes(self):
        sizes = self.c_sizes()
        for name, mirror in self.MIRRORS.items():
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(mirror), sizes[name])
