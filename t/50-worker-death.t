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
use POSIX qw(floor _exit WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);

use AffinityTest;
use AffinityConf qw(proxy_conf servers session_request);

my $t = AffinityTest->new;
my @ports = $t->start_backends(4, delay_ms => 2500);
my $status_port = $t->port;
my $N = 40;

$t->write_conf(proxy_conf($t, servers(\@ports) . <<'EOF', http => <<"HTTP"));
        session_affinity zone=deaths:1m;
        affinity_balance factor=1.25 slack=2;
EOF
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

# How many sockets a process has open.
sub sockets {
    my ($pid) = @_;
    opendir my $dh, "/proc/$pid/fd" or return 0;
    return scalar grep { (readlink("/proc/$pid/fd/$_") // '') =~ /^socket:/ }
                  readdir $dh;
}

# Starts $n slow requests in a child process; returns its pid.
sub load_in_background {
    my ($n, $prefix) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        $t->parallel([ map { session_request("$prefix-$_") } 1 .. $n ],
                     timeout => 20);
        _exit(0);
    }
    return $pid;
}

for my $round (1 .. 3) {
    my $child = load_in_background($N, "round$round");

    my $deadline = time + 10;
    sleep 0.05 until sum(0, inflight()) >= $N - 2 || time > $deadline;
    my $before = sum(0, inflight());
    ok $before >= $N - 2, "round $round: $before requests in flight";

    # The worker holding the requests: the one with the most sockets open
    # (a client's and a backend's for each).  Either may have accepted
    # them all.
    my ($victim) = sort { sockets($b) <=> sockets($a) } $t->worker_pids;
    cmp_ok sockets($victim), '>=', $N / 2,
        "round $round: worker $victim holds requests";
    ok kill('KILL', $victim), "round $round: worker $victim killed";

    waitpid $child, 0;
}

# The master respawns each killed worker; the next status after the load
# ends gives the dead workers' requests back.
my @left;
my $deadline = time + 10;
do {
    sleep 0.2;
    @left = inflight();
} until (@left && !grep { $_ != 0 } @left) || time > $deadline;

is_deeply \@left, [ (0) x @ports ], 'every peer at 0 in flight once the load ends';

my $s = status();
my $w = $s->{upstreams}{llm}{zones}{sessions}{workers};
ok $w->{reaped} >= 3, "$w->{reaped} dead workers' rows freed";
ok $w->{inflight_recovered} > 0,
    "$w->{inflight_recovered} requests of dead workers given back";
is $w->{rows_used}, scalar($t->worker_pids), 'one row per live worker';
like $t->error_log, qr/exited with \d+ requests in flight, given back/,
    'the error log says what was given back';

subtest 'in flight counts what is in flight, no more, no less' => sub {
    # Giving back too much would show as too few in flight (the status
    # reads no count below zero): 20 slow requests are 20 in flight.
    my $child = load_in_background(20, 'exact');
    my $deadline = time + 10;
    my ($at_backends, $counted) = (0, 0);
    while (time < $deadline) {
        $at_backends = sum(map { $t->backend_stats($_)->{inflight} } @ports);
        last if $at_backends == 20;
        sleep 0.05;
    }
    $counted = sum(0, inflight());
    is $at_backends, 20, '20 requests at the backends';
    is $counted, 20, '20 in flight in the status';
    waitpid $child, 0;
};

subtest "the bound holds again: $N concurrent requests of one session" => sub {
    my $mean = $N / @ports;
    my $bound = floor(max(1.25 * $mean, $mean + 2));

    $t->backend_reset($_) for @ports;
    my @res = $t->parallel([ map { session_request('hot') } 1 .. $N ]);
    is scalar(grep { $_->{status} == 200 } @res), $N, 'all served';

    for my $p (@ports) {
        my $peak = $t->backend_stats($p)->{max_inflight};
        ok $peak <= $bound, "backend $p peaked at $peak <= $bound";
    }
};

$t->stop_nginx;
is_deeply [ grep { !/exited on signal 9/ } $t->log_problems ], [],
    'no alert, crit, emerg or crash but the kills';

done_testing;
