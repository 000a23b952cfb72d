#!/usr/bin/env perl

# Workers killed with requests in flight (a crash, the OOM killer, kill -9)
# never end those requests.  Their in-flight counts are given back by the
# surviving workers: once the load ends every peer is at zero again, and
# the load bound holds for a hot session as before, with no restart.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP qw(decode_json);
use List::Util qw(max sum);
use POSIX qw(floor _exit);
use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers session_request eventually);

my $t = AffinityTest->new;
my $slow = $t->sanitized ? 4 : 1;

# The requests of these tests are held at the backends until released: a
# worker killed holds them whatever the machine's speed.  Each is tagged
# with the pid of the worker that proxied it.
my @ports = $t->start_backends(4);
my $status_port = $t->port;
my $N = 40;

$t->write_conf(proxy_conf($t, servers(\@ports) . <<'EOF',
        session_affinity zone=deaths:1m;
        affinity_balance factor=1.25 slack=2;
EOF
    location => "            proxy_set_header X-Tag \$pid;\n",
    http => <<"HTTP"));
    server {
        listen 127.0.0.1:$status_port;
        location = /status { affinity_status; }
    }
HTTP
$t->start_nginx;

sub status {
    my $r = $t->http(GET => '/status', port => $status_port);
    return $r->{status} == 200 ? decode_json($r->{body}) : undef;
}

sub inflight {
    my $s = status() or return;
    return map { $_->{inflight} } @{ $s->{upstreams}{llm}{peers} };
}

# Sends $n requests the backends hold from a child process (sessions
# $prefix-1 .. $prefix-$n, or one session without $prefix); returns its
# pid.  It exits with the count of them answered 200.
sub load_in_background {
    my ($n, $prefix) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my @res = $t->parallel([ map {
            session_request(defined $prefix ? "$prefix-$_" : 'hot',
                            headers => { 'X-Hold' => 1 })
        } 1 .. $n ]);
        _exit(scalar grep { $_->{status} == 200 } @res);
    }
    return $pid;
}

# The requests held at the backends.
sub held {
    return sum(map { $t->backend_stats($_)->{held} } @ports);
}

# Waits until the backends hold $n requests; returns how many they hold.
sub wait_held {
    my ($n) = @_;
    eventually(sub { held() >= $n }, 30 * $slow);
    return held();
}

# The requests held at the backends, by the pid of the worker holding them.
sub held_by_worker {
    my %by;
    for my $p (@ports) {
        my $tags = $t->backend_tags($p);
        $by{$_} += $tags->{$_} for keys %$tags;
    }
    return \%by;
}

sub release_all {
    $t->backend_release($_) for @ports;
}

# Ends a child of load_in_background; returns its count of 200s.
sub served {
    my ($child) = @_;
    waitpid $child, 0;
    return $? >> 8;
}

my $held_by_victims = 0;

for my $round (1 .. 3) {
    my $child = load_in_background($N, "round$round");

    is wait_held($N), $N, "round $round: $N requests held at the backends";
    is sum(0, inflight()), $N, "round $round: $N in flight in the status";

    # The worker holding the most of them is killed: they never end.
    my $by = held_by_worker();
    my ($victim) = sort { $by->{$b} <=> $by->{$a} } keys %$by;
    my $holds = $by->{$victim};
    ok((grep { $_ == $victim } $t->worker_pids),
       "round $round: worker $victim holds $holds");
    ok kill('KILL', $victim), "round $round: worker $victim killed";

    release_all();
    is served($child), $N - $holds,
        "round $round: the other workers' requests served";

    # A status, a request or a new worker, a second after the last look,
    # gives them back.
    my $given = qr/process $victim exited with (\d+) requests in flight,/;
    eventually(sub { status(); $t->error_log =~ $given }, 30 * $slow);
    my ($back) = $t->error_log =~ $given;
    is $back, $holds, "round $round: its $holds requests given back";
    $held_by_victims += $holds;
}

# The master respawns each killed worker; once the load ends every peer is
# at zero again.
my @left;
eventually(sub {
    @left = inflight();
    @left && !grep { $_ != 0 } @left;
}, 10 * $slow);

is_deeply \@left, [ (0) x @ports ], 'every peer at 0 in flight once the load ends';

my $s = status();
my $w = $s->{upstreams}{llm}{zones}{sessions}{workers};
is $w->{reaped}, 3, "$w->{reaped} dead workers' rows freed";
is $w->{inflight_recovered}, $held_by_victims,
    "$w->{inflight_recovered} requests of dead workers given back";
is $w->{rows_used}, scalar($t->worker_pids), 'one row per live worker';

subtest 'in flight counts what is in flight, no more, no less' => sub {
    # Giving back too much would show as too few in flight (the status
    # reads no count below zero): 20 held requests are 20 in flight.
    my $child = load_in_background(20, 'exact');
    is wait_held(20), 20, '20 requests at the backends';
    is sum(0, inflight()), 20, '20 in flight in the status';
    release_all();
    is served($child), 20, 'all served';
};

subtest "the bound holds again: $N concurrent requests of one session" => sub {
    my $mean = $N / @ports;
    my $bound = floor(max(1.25 * $mean, $mean + 2));

    $t->backend_reset($_) for @ports;
    my $child = load_in_background($N);
    is wait_held($N), $N, "$N requests in flight at once";
    release_all();
    is served($child), $N, 'all served';

    for my $p (@ports) {
        my $peak = $t->backend_stats($p)->{max_inflight};
        ok $peak <= $bound, "backend $p peaked at $peak <= $bound";
    }
};

$t->stop_nginx;
is_deeply [ grep { !/exited on signal 9/ } $t->log_problems ], [],
    'no alert, crit, emerg or crash but the kills';

done_testing;
