#!/usr/bin/env perl

# Whatever the store's endpoint sends, the workers keep serving.  An nginx
# with affinity_store (two workers, the announcements of affinity_metrics
# too) is pointed at a fake store that misbehaves in one way after another
# (t/fake-store.pl): a reply before any command, an HTTP error, random
# bytes, RESP3, arrays nested a thousand deep, every reply twice, no reply
# at all, a connection shut for writing, an endless reply a byte at a time
# or as fast as it goes, XREAD answered at once with nil, with an entry
# that has no id or with one read before, XADD answered with what is not
# an id.  Under load
# through all of them: no request fails, no worker exits, the outage is
# logged once per worker, the workers try again with growing waits, not in
# a loop, and the reader never asks again and again.  Then a real
# redis-server takes the port, and the instance is back within seconds.
# Last, three entries of 64 MB in the stream: a second instance reads past
# them, its workers' memory unchanged, and takes the pins that follow, on
# start and again after a reload (which reads the stream from its start).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers chat eventually routes);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 2);
my @replicas = $a->start_mock_replicas(3, '--decode-ms-per-token', 0.2);
my $store = $a->port;
my $stream = "affinity-hostile-$$";
my $conns = $a->path('logs/fake-store.conns');
my $b_status = $b->port;

my $upstream = servers(\@replicas)
    . "        session_affinity header=X-Session-ID zone=%s:1m;\n"
    . "        prefix_affinity zone=%s_p:1m;\n"
    . "        affinity_metrics interval=1s timeout=500ms;\n"
    . "        affinity_store 127.0.0.1:$store stream=$stream timeout=%s;\n";

# A waits half a second for each reply of the fake stores; B the default,
# as the store copies the big entries to it.
$a->write_conf(proxy_conf($a, sprintf($upstream, 'a', 'a', '500ms')));
$b->write_conf(proxy_conf($b, sprintf($upstream, 'b', 'b', '2s'),
    http => "    server {\n        listen 127.0.0.1:$b_status;\n"
          . "        location / { affinity_status; }\n    }\n"));

my %ct = ('Content-Type' => 'application/json');

sub replica { $_[0]{headers}{'x-replica-port'} // 'none' }

# A batch of keyed requests through A, in parallel: their statuses.
my $n = 0;
sub batch {
    my @requests = map {
        $n++;
        { method => 'POST', path => '/v1/chat/completions',
          headers => { %ct, 'X-Session-ID' => "hostile-" . ($n % 40) },
          body => chat([ user => "question $n" ]) }
    } 1 .. 12;
    return map { $_->{status} } $a->parallel(\@requests);
}

sub connections {
    open my $fh, '<', $conns or return 0;
    return scalar grep { /^connect / } <$fh>;
}

sub xreads {
    open my $fh, '<', $conns or return 0;
    return scalar grep { /^xread / } <$fh>;
}

sub closes {
    open my $fh, '<', $conns or return 0;
    return scalar grep { /^close / } <$fh>;
}

sub outages {
    my ($t) = @_;
    return scalar(() = $t->error_log =~ /store of upstream "llm" unavailable/g);
}

$a->start_nginx;
my @workers = sort $a->worker_pids;

# ---- a fake store that misbehaves ------------------------------------------

my ($served, $failed) = (0, 0);
my $started = time;

# Three seconds of load with the fake store of a mode.
sub misbehave {
    my ($mode) = @_;
    my ($before, $reads, $closed) = (connections(), xreads(), closes());
    $a->start_service("fake-$mode" => $store, $^X,
                      "$FindBin::Bin/fake-store.pl", '--port', $store,
                      '--mode', $mode, '--log', $conns);
    my $until = time + 3;
    while (time < $until) {
        for my $status (batch()) {
            $status == 200 ? $served++ : $failed++;
        }
    }
    cmp_ok connections() - $before, '>=', 1, "$mode: the store was tried";
    cmp_ok xreads() - $reads, '<=', 4,
        "$mode: the reader does not ask in a loop";
    if ($mode eq 'noid' || $mode eq 'old') {
        ok eventually(sub { closes() - $closed >= 2 }, 10),
            "$mode: the reader's connection is closed";
    }
    if ($mode eq 'trickle' || $mode eq 'flood') {
        # one close is the harness's own, when it waits for the port; the
        # workers' next try may come after the three seconds
        ok eventually(sub { closes() - $closed >= 2 }, 10),
            "$mode: a connection with an endless reply is closed";
    }
    $a->stop_service("fake-$mode");
}

misbehave($_) for qw(unsolicited greeting junk resp3 deep extra silent
                     halfclose trickle flood notid);

my $elapsed = time - $started;
is $failed, 0, "no request failed through every misbehaving store ($served served)";
is_deeply [ sort $a->worker_pids ], \@workers, 'no worker exited';
is scalar(grep { /exited on signal|\[alert\]|\[crit\]/ } split /\n/, $a->error_log), 0,
    'no crash, alert or critical line';

# Three connections (two writers, one reader) tried again with waits that
# double from 1 s to 10 s: a few each over the modes, not one per request.
my $tries = connections();
cmp_ok $tries, '<=', 3 * (2 + $elapsed / 1.5),
    sprintf('%d connections in %.0f s: the workers wait between tries', $tries, $elapsed);

# Once per worker for the whole outage, with the reason.
my $lines = outages($a);
cmp_ok $lines, '>=', 1, 'the outage is logged';
cmp_ok $lines, '<=', 2, "once per worker ($lines)";
like $a->error_log, qr/unavailable for (writing|reading) \(([a-z]|the |no |a )/,
    'with its reason';

# Stores that take writes but answer reads strangely: XREAD answered at
# once with nil, with an entry that has no stream id, or with the same
# old entry again and again.  The writer may
# find them back; the reader neither asks in a loop nor serves less.
misbehave($_) for qw(nil noid old);
is $failed, 0, "no request failed through them either ($served served)";
is_deeply [ sort $a->worker_pids ], \@workers, 'no worker exited';
# each is stopped before the next starts: an outage the writer may see
cmp_ok outages($a) - $lines, '<=', 2 * 3,
    'said at most once per worker and store';

# ---- a real store on the same port: back -----------------------------------

$a->start_redis($store);
ok eventually(sub { $a->error_log =~ /store of upstream "llm" is back/ }, 15),
    'A finds the store back';

# ---- entries of 64 MB -----------------------------------------------------

# Written as a client of the store would, between others' entries.
sub xadd_big {
    my $size = 64 * 1024 * 1024;
    my $s = AffinityTest::redis_send($store, 'XADD', $stream, '*', 'm',
                                     'x' x $size);
    my $reply = <$s> // '';
    close $s;
    return $reply;
}

like xadd_big(), qr/^\$\d+\r\n$/, 'a 64 MB entry is in the stream' for 1 .. 3;

sub rss_kb {
    my ($pid) = @_;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    while (<$fh>) {
        return $1 if /^VmRSS:\s+(\d+)\s+kB/;
    }
    return 0;
}

sub worst_rss {
    my ($t) = @_;
    my $worst = 0;
    for my $kb (map { rss_kb($_) } $t->worker_pids) {
        $worst = $kb if $kb > $worst;
    }
    return $worst;
}

# Pins learned on A after the big entries reach B, which reads past them.
sub pinned_on_a {
    my ($tag) = @_;
    my %on;
    for my $i (1 .. 10) {
        my $res = $a->http(POST => '/v1/chat/completions',
            headers => { %ct, 'X-Session-ID' => "$tag-$i" },
            body => chat([ user => "after the big entries, $i" ]));
        $on{"$tag-$i"} = replica($res);
    }
    return %on;
}

# B is asked once it has taken them in (its sessions zone's inserts): a
# session it saw first it would
# place itself, and its pin, newer than A's, would win.
sub b_applied {
    my $s = JSON::PP->new->decode($b->http(GET => '/', port => $b_status)->{body});
    return $s->{upstreams}{llm}{zones}{sessions}{inserts};
}

# B has read what the stream held when it started (the batches' pins
# too, which count among its inserts): what it reads no longer grows.
sub b_read_up {
    my $read = -1;
    return eventually(sub {
        my $s = JSON::PP->new->decode(
            $b->http(GET => '/', port => $b_status)->{body});
        my $now = $s->{upstreams}{llm}{store}{read};
        return 1 if $now == $read;
        $read = $now;
        sleep 0.3;
        return 0;
    }, 30);
}

sub followed_on_b {
    my ($since, %on) = @_;
    return 0 unless eventually(sub { b_applied() >= $since + keys %on }, 20);
    my $same = 0;
    for my $session (sort keys %on) {
        my $res = $b->http(POST => '/v1/chat/completions',
            headers => { %ct, 'X-Session-ID' => $session },
            body => chat([ user => "another turn of $session" ]));
        $same++ if replica($res) eq $on{$session};
    }
    return $same;
}

$b->start_nginx;
my $base = worst_rss($b);
ok b_read_up(), 'B read the stream, past the big entries';
my $since = b_applied();
my %on = pinned_on_a('big');

is followed_on_b($since, %on), 10,
    'B reads past the big entries and follows A\'s pins'
    or diag explain [ (routes($b))[-10 .. -1] ];
my $after = worst_rss($b);
cmp_ok $after - $base, '<', 32 * 1024,
    sprintf('B\'s workers took in none of them whole (%d kB, %d kB before)',
            $after, $base);

# A reload reads the stream again from its start.
$b->reload_nginx;
ok b_read_up(), 'B read the stream again after its reload';
$since = b_applied();
my %again = pinned_on_a('reloaded');
is followed_on_b($since, %again), 10, 'after a reload too';
cmp_ok worst_rss($b) - $base, '<', 32 * 1024, '... with the same memory';


is_deeply [ grep { !/exited on signal 9/ } $a->log_problems ], [],
    'A: no alerts, crashes or sanitizer reports';
is_deeply [ $b->log_problems ], [], 'B: no alerts, crashes or sanitizer reports';

done_testing;
