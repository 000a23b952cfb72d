#!/usr/bin/env perl

# With affinity_store and affinity_metrics, each nginx instance announces
# every request it sends: the other instances count it on the peer's load
# until that peer's engine reports again, instead of seeing the peer as
# idle for a whole polling interval.  Here
# instance A sees one replica only and keeps it 24 requests deep; instance
# B polls the engines every 10 s and places 40 new sessions right after a
# poll that found them all idle.  Through the store none goes to A's
# replica; an upstream of B without the store sends it its share.  When
# A's requests end, B counts the replica idle again before its next poll.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers chat proxied_upstream eventually
                    engine_figures);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 2);
my @replicas = $a->start_mock_replicas(4, '--decode-ms-per-token', 20);
my $redis = $a->port;
my $stream = "affinity-load-$$";
my $blind = $b->port;
my $status = $b->port;
my $a_status = $a->port;

$a->start_redis($redis);

my $busy = $replicas[0];
my %down = map { $_ => 'down' } @replicas[1 .. 3];
my $directives = "        session_affinity header=X-Session-ID zone=%s_s:1m;\n"
    . "        prefix_affinity zone=%s_p:4m;\n";
my $store = "        affinity_store 127.0.0.1:$redis stream=$stream;\n";
my $metrics = "        affinity_metrics interval=10s timeout=1s;\n";

$a->write_conf(proxy_conf($a, servers(\@replicas, %down)
        . sprintf($directives, 'a', 'a') . $store
        . "        affinity_metrics interval=30s timeout=1s;\n",
    location => "            add_header X-Worker \$pid always;\n",
    http => "    server {\n        listen 127.0.0.1:$a_status;\n"
          . "        location / { affinity_status; }\n    }\n"));
$b->write_conf(proxy_conf($b, servers(\@replicas)
        . sprintf($directives, 'b', 'b') . $store . $metrics,
    http => proxied_upstream(blind => servers(\@replicas)
                                      . sprintf($directives, 'c', 'c')
                                      . $metrics, $blind)
        . "    server {\n        listen 127.0.0.1:$status;\n"
        . "        location / { affinity_status; }\n    }\n"));
$a->start_nginx;
$b->start_nginx;

my $json = JSON::PP->new;

sub engines { engine_figures($b, $status, $_[0]) }

# Both of B's upstreams have a fresh figure of every replica (all idle), and
# the next poll is seconds away.
ok eventually(sub {
        for my $u (qw(llm blind)) {
            my $e = engines($u);
            return 0 unless 4 == grep { defined $e->{$_}
                                        && $e->{$_}{age} <= 1 } @replicas;
        }
        return 1;
    }, 15), 'B knows every replica\'s own load, freshly polled';

# Each worker appends; the first of each instance reads the stream, and
# reads every worker's announcements back.
{
    # Workers start one after the other: under load the second worker of
    # an instance may still be connecting when both readers are in.
    my @clients;
    ok eventually(sub {
            @clients = AffinityTest::redis_clients($redis);
            return 2 == grep { ($_->{cmd} // '') eq 'xread' } @clients;
        }, 5), 'one worker of each instance reads the stream';
    ok eventually(sub {
            @clients = AffinityTest::redis_clients($redis);
            return @clients >= 6;
        }, 5), '... and every worker has a writer';
    is scalar(@clients), 6, '... one each';
}

# ---- A keeps its replica busy ----------------------------------------------

my (@socks, %a_workers);
my $sent = time;
for my $i (1 .. 24) {
    my $body = $json->encode({ model => 'm', stream => JSON::PP::true,
        max_tokens => 400, messages => [ { role => 'user',
                                          content => "from A, $i" } ] });
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $a->listen_port)
        or die "connect: $!";
    print {$s} "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        . "X-Session-ID: a-$i\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\n\r\n$body";
    push @socks, $s;
}

# B counts each of A's requests once; its upstream without the store counts
# none.
ok eventually(sub { (engines('llm')->{$busy}{elsewhere} // 0) >= 24 }, 5),
    'B counts the requests A announced';
is engines('llm')->{$busy}{elsewhere}, 24, '... each once';
is engines('blind')->{$busy}{elsewhere}, 0, '... not without the store';

# New sessions, one through each of B's upstreams in turn, so that both
# see the same moment.
my (%shared, %alone);
my $t0 = time;
for my $i (1 .. 40) {
    for my $to ([ $b->listen_port, \%shared ], [ $blind, \%alone ]) {
        my $res = $b->http(POST => '/v1/chat/completions', port => $to->[0],
            headers => { 'Content-Type' => 'application/json',
                         'X-Session-ID' => "new-$i" },
            body => chat([ user => "question $i" ])
                        =~ s/"max_tokens":64/"max_tokens":1/r);
        $to->[1]{ $res->{headers}{'x-replica-port'} // 'none' }++;
    }
}
my $took = time - $t0;
my ($shared, $alone) = (\%shared, \%alone);
note sprintf 'new sessions on A\'s replica: %d through the store, %d without'
    . ' (%.1f s)', $shared->{$busy} // 0, $alone->{$busy} // 0, $took;

is $shared->{$busy} // 0, 0,
    'through the store, no new session goes to the replica A keeps busy';
SKIP: {
    # a poll since A's requests began would have shown the busy replica
    # to both upstreams: only a figure older than them tells (ages are
    # whole seconds, rounded down, so an age under the time since then may
    # be of a poll after it)
    skip 'B polled again since A\'s requests began', 1
        if engines('blind')->{$busy}{age} < time - $sent;
    cmp_ok $alone->{$busy} // 0, '>=', 4,
        'without the store it takes its share (the test can tell)';
}

# A's first worker reads the stream for both of A's workers: each of the
# 24 announcements, whichever worker sent it, is read back, and none stays
# unheard there until the engine's next report.
for my $s (@socks) {
    while (my $line = <$s>) {
        last if $line =~ /^\r?\n$/;
        $a_workers{$1}++ if $line =~ /^X-Worker:\s*(\d+)/i;
    }
}
SKIP: {
    skip 'one of A\'s workers took all 24', 1 unless keys %a_workers == 2;
    my $read_back = eventually(sub {
            (engine_figures($a, $a_status, 'llm')->{$busy}{unheard} // -1)
                == 0
        }, 3);
    # a report of the engine since (they are 30 s apart) would clear it
    skip 'A polled the replica since', 1
        if engine_figures($a, $a_status, 'llm')->{$busy}{age} + 1
           <= time - $sent;
    ok $read_back, 'A reads back what both its workers announced';
}

# A's requests end: B takes each off the replica's load as A says so, not
# when the replica's engine next reports.  Counted either way, on top of a
# figure taken before A's requests (0 + 24 - 24) or during them
# (24 + 0 - 24), the replica is idle again.
my $closed = time;
close $_ for @socks;
my $e;
eventually(sub { $e = engines('llm')->{$busy};
                 $e->{load} + $e->{elsewhere} == 0 }, 3);
note sprintf 'after A\'s requests ended: figure %d, elsewhere %d, %d s old',
    @$e{qw(load elsewhere age)};
SKIP: {
    # a poll since they ended would have found the replica idle anyway
    skip 'B polled again since A\'s requests ended', 1
        if $e->{age} <= time - $closed + 1;
    is $e->{load} + $e->{elsewhere}, 0,
        'B takes the requests that ended on A off the replica\'s load';
}

is_deeply [ $a->log_problems ], [], 'A: no alerts, crashes or sanitizer reports';
is_deeply [ $b->log_problems ], [], 'B: no alerts, crashes or sanitizer reports';

done_testing;
