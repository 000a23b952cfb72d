#!/usr/bin/env perl

# affinity_balance: many concurrent slow requests of one hot session never
# push a backend past max(factor * mean, mean + slack) in-flight requests,
# counted across all four workers; the session keeps its pin.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use List::Util qw(max sum);
use POSIX qw(floor);
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes session_request);

my $t = AffinityTest->new;
my @ports = $t->start_backends(4, delay_ms => 1500);
my $N = 60;

$t->write_conf(proxy_conf($t, servers(\@ports) . <<'EOF'));
        session_affinity zone=bounded:1m;
        affinity_balance factor=1.25 slack=2;
EOF
$t->start_nginx;

my $pinned = $t->http(GET => '/', headers => { 'X-Session-ID' => 'hot' })
               ->{headers}{'x-backend-port'};
ok $pinned, "hot session pinned to $pinned";

# The largest in-flight count any backend may reach while at most $N
# requests are in flight: the bound with all $N counted.
my $mean = $N / @ports;
my $bound = floor(max(1.25 * $mean, $mean + 2));

subtest "$N concurrent requests of one session" => sub {
    $t->backend_reset($_) for @ports;
    my @res = $t->parallel([ map { session_request('hot') } 1 .. $N ]);
    is scalar(grep { $_->{status} == 200 } @res), $N, 'all served';

    my %peak = map { $_ => $t->backend_stats($_)->{max_inflight} } @ports;
    note join ' ', map { "$_:$peak{$_}" } @ports;
    for my $p (@ports) {
        ok $peak{$p} <= $bound, "backend $p peaked at $peak{$p} <= $bound";
    }
    ok $peak{$pinned} >= $bound - 4,
        "the pinned backend took its share ($peak{$pinned})";
    is sum(map { $t->backend_stats($_)->{requests} } @ports), $N,
        'each request reached one backend';
};

subtest 'after the burst the session stays on one backend' => sub {
    # Spills move the pin to the backend that took the request (it holds
    # the whole conversation then); the session ends on one backend.
    my $n = () = routes($t);
    my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => 'hot' });
    my $home = $r->{headers}{'x-backend-port'};
    my @r = routes($t);
    is $r[$n]{route}, 'session_hit', "a pin hit on $home";
    for (1 .. 5) {
        is $t->http(GET => '/', headers => { 'X-Session-ID' => 'hot' })
               ->{headers}{'x-backend-port'}, $home, 'and it stays there';
    }

    my @burst = @r[1 .. $N];
    is scalar(grep { $_->{route} eq 'session_hit' || $_->{route} eq 'session_spill' }
              @burst), $N, 'burst requests were pin hits or spills';
    ok scalar(grep { $_->{route} eq 'session_spill' } @burst) > 0,
        'spills are logged as session_spill, as the status names them';
    is scalar(grep { $_->{route} eq 'session_moved' } @burst), 0,
        'no pin moved: its peer never failed';
};

subtest 'the bound holds with weights' => sub {
    my $conf = proxy_conf($t, servers(\@ports, $ports[0] => 'weight=3') . <<'EOF');
        session_affinity zone=weighted:1m;
        affinity_balance factor=1.5 slack=0;
EOF
    $t->write_conf($conf);
    $t->reload_nginx;
    $t->backend_reset($_) for @ports;

    my @res = $t->parallel([ map { session_request("k$_") } 1 .. $N ]);
    is scalar(grep { $_->{status} == 200 } @res), $N, 'all served';

    # shares: weight 3 of 6, 1 of 6 for the others
    my %limit = map { $_ => floor(1.5 * $N / 6) } @ports;
    $limit{ $ports[0] } = floor(1.5 * $N * 3 / 6);
    for my $p (@ports) {
        my $peak = $t->backend_stats($p)->{max_inflight};
        ok $peak <= $limit{$p}, "backend $p peaked at $peak <= $limit{$p}";
    }
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
