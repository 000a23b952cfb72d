#!/usr/bin/env perl

# session_affinity: every request of a session goes to one backend, new
# sessions spread evenly and follow weights, keyless requests fall back.
# Sessions send their turns one after another, as chat clients do; bursts
# that push a backend over the load bound are the subject of 14-bounded-load.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use List::Util qw(max sum);
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes session_request);

my $t = AffinityTest->new;
my @ports = $t->start_backends(4);
my @weighted = $t->start_backends(3);
my $wport = $t->port;

$t->write_conf(proxy_conf($t, servers(\@ports) . <<"EOF", http => <<"HTTP"));
        session_affinity header=X-Session-ID zone=sticky:4m;
EOF
    upstream weighted {
        server 127.0.0.1:$weighted[0];
        server 127.0.0.1:$weighted[1];
        server 127.0.0.1:$weighted[2] weight=2;
        session_affinity header=X-Session-ID zone=weighted:1m;
    }

    server {
        listen 127.0.0.1:$wport;
        location / { proxy_pass http://weighted; }
    }
HTTP
$t->start_nginx;

# Sends every request spec, $opt{batch} at a time (1: one after another,
# as a client waiting for each answer does).
sub send_all {
    my ($reqs, %opt) = @_;
    my $batch = delete $opt{batch} // 1;
    my @res;
    for (my $i = 0; $i < @$reqs; $i += $batch) {
        my $end = $i + $batch - 1 < $#$reqs ? $i + $batch - 1 : $#$reqs;
        push @res, $t->parallel([ map { { %$_, %opt } } @{$reqs}[$i .. $end] ]);
    }
    return @res;
}

subtest '500 sessions x 4 requests stick to one backend each' => sub {
    my @ids = map { "conv-$_" } 1 .. 500;
    my (%backend_of, %split, $failed);

    for my $round (1 .. 4) {
        my @res = send_all([ map { session_request($_) } @ids ]);
        for my $i (0 .. $#ids) {
            my $r = $res[$i];
            $failed++ if $r->{status} != 200;
            my $b = $r->{headers}{'x-backend-port'} // 'none';
            $backend_of{ $ids[$i] } //= $b;
            $split{ $ids[$i] }++ if $backend_of{ $ids[$i] } ne $b;
        }
    }

    ok !$failed, 'all 2000 requests answered 200';
    is scalar(keys %split), 0, 'no session was served by two backends';

    my %pins;
    $pins{$_}++ for values %backend_of;
    my @counts = map { $pins{$_} // 0 } @ports;
    my $mean = sum(@counts) / @counts;
    my $ratio = max(@counts) / $mean;
    # 500 keys on a ring of four equal peers on random ports: sampling
    # alone takes the fullest peer past 1.3 x the mean for about one port
    # set in 1,200, past 1.4 for one in 200,000.  A ring that gives one
    # peer a third of the keys lands near 1.5.
    note sprintf 'pins per backend: %s, max/mean %.3f', "@counts", $ratio;
    ok $ratio <= 1.4, "pins spread evenly (max/mean $ratio <= 1.4)";

    my @r = routes($t);
    is scalar(grep { $_->{route} eq 'session_new' } @r), 500,
        'each session was pinned once';
    is scalar(grep { $_->{route} eq 'session_hit' } @r), 1500,
        'the later requests hit their pin';
    is scalar(grep { $_->{session} !~ /^conv-\d+$/ } @r), 0,
        '$affinity_session is the session key';
};

subtest 'pins follow weights' => sub {
    my @res = send_all([ map { session_request("w-$_") } 1 .. 800 ],
                       port => $wport);
    my %n;
    $n{ $_->{headers}{'x-backend-port'} // 'none' }++ for @res;
    my @share = map { ($n{$_} // 0) / 800 } @weighted;
    note sprintf 'shares: %.3f %.3f %.3f', @share;
    ok $share[2] > 0.40 && $share[2] < 0.60, 'weight=2 backend takes about half';
    ok $share[0] > 0.17 && $share[0] < 0.33, 'weight=1 backend takes a quarter';
    ok $share[1] > 0.17 && $share[1] < 0.33, 'other weight=1 backend too';
};

subtest 'requests without a key fall back to least in-flight' => sub {
    my $before = () = routes($t);
    my @res = send_all([ map { session_request(undef) } 1 .. 200 ],
                       batch => 20);
    is scalar(grep { $_->{status} == 200 } @res), 200, 'all served';

    my %n;
    $n{ $_->{headers}{'x-backend-port'} // 'none' }++ for @res;
    is scalar(grep { $n{$_} } @ports), 4, 'spread over all backends';

    my @r = (routes($t))[$before .. $before + 199];
    is scalar(grep { $_->{route} eq 'fallback' } @r), 200,
        '$affinity_route is fallback';
    is scalar(grep { $_->{session} ne '-' } @r), 0, 'no session key';
    ok !exists $res[0]{headers}{'x-session-id'}, 'no key echoed';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
