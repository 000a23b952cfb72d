#!/usr/bin/env perl

# Faults a real store has, survived without loss or silence.  Two instances
# share through a redis-server.  A stream id from the future, then the
# stream deleted: its ids go back, and sharing resumes within seconds, also
# after a reload whose zone remembers the future id.  Reading the stream
# again (a reload, every worker killed) never puts back a pin that moved
# since.  The store stopped (SIGSTOP) without closing: the outage is noticed
# and said once per worker, what is learned meanwhile is kept and sent once
# the store runs again.  The store demoted to a read-only replica: writes
# refused are kept, and sent once it takes writes again.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers chat eventually routes);
use AffinityStore qw(xadd entries);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 2);
my @replicas = $a->start_mock_replicas(4, '--decode-ms-per-token', 0.2);
my $redis = $a->port;
my $replica_port = $a->port;
my $stream = "affinity-faults-$$";
my $b_status = $b->port;
my $json = JSON::PP->new;
my %ct = ('Content-Type' => 'application/json');

sub file {
    my ($t, $name, $text) = @_;
    my $path = $t->path($name);
    open my $fh, '>', $path or die "$path: $!";
    print {$fh} $text;
    close $fh;
    chmod 0600, $path;
    return $path;
}

my %secret = (a => file($a, 'secret', "faults test secret, 32 bytes long\n"),
              b => file($b, 'secret', "faults test secret, 32 bytes long\n"));

# A sees one replica only; B sees all, or all but the one given.
my $only = $replicas[3];

sub configure {
    my ($t, $port, %down) = @_;
    my $name = $t == $a ? 'a' : 'b';
    %down = map { $_ => 'down' } @replicas[0 .. 2] if $t == $a;
    $t->write_conf(proxy_conf($t, servers(\@replicas, %down)
        . "        session_affinity header=X-Session-ID zone=s:1m;\n"
        . "        affinity_store 127.0.0.1:$port stream=$stream "
        . "secret=$secret{$name};\n",
        http => $t == $b
            ? "    server {\n        listen 127.0.0.1:$b_status;\n"
              . "        location / { affinity_status; }\n    }\n"
            : ''));
}

sub replica { $_[0]{headers}{'x-replica-port'} // 'none' }

sub ask {
    my ($t, $session, $text) = @_;
    return $t->http(POST => '/v1/chat/completions',
        headers => { %ct, 'X-Session-ID' => $session },
        body => chat([ user => $text // "Hello from $session" ]));
}

sub b_status {
    return $json->decode($b->http(GET => '/', port => $b_status)->{body})
        ->{upstreams}{llm};
}

# Sessions A places: all on its one replica.
sub placed_on_a {
    my ($tag, $n) = @_;
    my @sessions = map { "$tag-$_" } 1 .. ($n // 6);
    is scalar(grep { replica(ask($a, $_)) eq $only } @sessions),
        scalar(@sessions), "$tag: A places its sessions";
    return @sessions;
}

# How many of them B sends where A did.  B is asked only once it has
# applied them (its pins' count): a session B saw first it would place
# itself, and its pin, newer than A's, would win.
sub applied_by_b { return b_status()->{store}{applied} }

sub followed_on_b {
    my ($since, $within, @sessions) = @_;
    return 0 unless eventually(sub { applied_by_b() >= $since + @sessions },
                               $within);
    return scalar grep { replica(ask($b, $_, "again $_")) eq $only } @sessions;
}

sub count_in_log {
    my ($t, $re) = @_;
    return scalar(() = $t->error_log =~ /$re/g);
}

my $redis_pid = $a->start_redis($redis);
configure($a, $redis);
configure($b, $redis);
$a->start_nginx;
$b->start_nginx;

{
    my $since = applied_by_b();
    my @s = placed_on_a('start');
    is followed_on_b($since, 5, @s), scalar(@s), 'B follows A';
}

# ---- ids from the future, then the stream deleted --------------------------

for my $round ('read on', 'a reload between') {
    my $malformed = b_status()->{store}{malformed};
    like xadd($redis, $stream, m => 'from the future') // '', qr/^\d+-\d+$/,
        "$round: an entry";
    my $s = AffinityTest::redis_send($redis, 'XADD', $stream,
                                     '99999999999999-0', 'm', 'future');
    like scalar(<$s>), qr/^\$/, "$round: an entry with an id from the future";
    close $s;
    # B reads both, not messages: its record of the stream is in the future
    ok eventually(sub { b_status()->{store}{malformed} >= $malformed + 2 },
                  10), "$round: B reads them";
    my $rewound = b_status()->{store}{rewound};
    $s = AffinityTest::redis_send($redis, 'DEL', $stream);
    like scalar(<$s>), qr/^:1/, "$round: the stream deleted";
    close $s;
    $b->reload_nginx if $round eq 'a reload between';

    my $since = applied_by_b();
    my @s = placed_on_a("future-" . ($round =~ /reload/ ? 2 : 1));
    my $from = time;
    is followed_on_b($since, 12, @s), scalar(@s),
        "$round: B follows A again";
    note sprintf '%s: %.1f s', $round, time - $from;
    cmp_ok b_status()->{store}{rewound}, '>', $rewound,
        "$round: B saw the ids go back";
}
like $b->error_log, qr/stream of upstream "llm" went back from 99999999999999-0/,
    'and said so';

# The stream restored from an older copy: entries B read before come back
# under lower ids.  B reads them again as a stream that went back, not as
# replays of their writers' messages.
{
    my ($since) = applied_by_b();
    placed_on_a('restored', 4);
    ok eventually(sub { applied_by_b() >= $since + 4 }, 8), 'B read A\'s pins';
    my @copy = grep { defined $_->[1]{m} } entries($redis, $stream);
    my ($rewound, $replayed) = @{ b_status()->{store} }{qw(rewound replayed)};
    my $s = AffinityTest::redis_send($redis, 'DEL', $stream);
    like scalar(<$s>), qr/^:1/, 'the stream deleted';
    close $s;
    my $i = 0;
    for my $e (@copy) {
        $s = AffinityTest::redis_send($redis, 'XADD', $stream, '1-' . ++$i,
                                      'm', $e->[1]{m});
        <$s>;
        close $s;
    }
    ok eventually(sub { b_status()->{store}{rewound} > $rewound }, 12),
        'B reads the restored stream from its start';
    sleep 0.5;      # for B to read the rest: one counted replayed would show
    is b_status()->{store}{replayed}, $replayed,
        'and counts none of its entries replayed';
}

# ---- reading the stream again never reverts a pin ------------------------------

{
    my $since = applied_by_b();
    my ($s) = placed_on_a('moving', 1);
    is followed_on_b($since, 5, $s), 1, 'B follows a session';

    # B loses A's replica: the session moves, B's pin the newest.
    configure($b, $redis, $only => 'down');
    $b->reload_nginx;
    my $moved = replica(ask($b, $s, 'moved'));
    isnt $moved, $only, 'B moves it';
    sleep 0.3;      # B's pin reaches the store before the reload

    configure($b, $redis);
    $b->reload_nginx;
    sleep 1;        # the new reader reads the stream from its start: the
                    # older pin put back would show
    is replica(ask($b, $s, 'after the reload')), $moved,
        'after a reload, B keeps the newer pin'
        or diag explain [ grep { $_->{session} eq $s } routes($b) ];

    kill 'KILL', $b->worker_pids;
    ok eventually(sub { scalar($b->worker_pids) == 2
                        && $b->http(GET => '/', port => $b_status)->{status} == 200 }, 10),
        'every worker of B killed and replaced';
    sleep 1;        # likewise
    is replica(ask($b, $s, 'after the workers died')), $moved,
        '... and after its workers died';
}

# ---- the store stops without closing --------------------------------------------

{
    my $lost = count_in_log($a, qr/unavailable for writing/);
    my $since = applied_by_b();
    kill 'STOP', $redis_pid or die "stop redis: $!";
    my @s = placed_on_a('stopped', 8);
    ok eventually(sub { count_in_log($a, qr/unavailable for writing \(no reply in time\)/) >= 1 }, 8),
        'A notices the stalled store';
    my @more = placed_on_a('stopped-more', 8);
    sleep 2.5;      # the workers try again: the outage said again would show
    cmp_ok count_in_log($a, qr/unavailable for/) - $lost, '<=', 2,
        'said once per worker';
    kill 'CONT', $redis_pid or die "continue redis: $!";
    is followed_on_b($since, 20, @s, @more), @s + @more,
        'what A learned while the store stalled reaches B once it runs';
    # The worker that reads says "back" once a read is answered too,
    # which may come after B has what the writer sent.
    ok eventually(sub { $a->error_log =~ /store of upstream "llm" is back/ }, 10),
        'A says the store is back';
}

# ---- the store demoted to a read-only replica -------------------------------------

{
    # a replica of a master that is not there: it refuses writes
    my $nowhere = $a->port;
    $a->start_service(replica => $replica_port, AffinityTest::redis_server(),
                      '--port', $replica_port, '--bind', '127.0.0.1',
                      '--save', '', '--appendonly', 'no',
                      '--replicaof', '127.0.0.1', $nowhere);
    configure($a, $replica_port);
    configure($b, $replica_port);
    $a->reload_nginx;
    $b->reload_nginx;

    my $since = applied_by_b();
    my @s = placed_on_a('refused', 8);
    ok eventually(sub { $a->error_log =~ /unavailable for writing \(writes refused: "READONLY/ }, 8),
        'A is refused its writes, and says why';
    my $back = count_in_log($a, qr/is back/);
    sleep 2;        # the workers try again: a wrong "is back" would show
    is count_in_log($a, qr/is back/), $back, 'and does not say it is back meanwhile';

    my $s = AffinityTest::redis_send($replica_port, 'REPLICAOF', 'NO', 'ONE');
    like scalar(<$s>), qr/^\+OK/, 'the replica is promoted';
    close $s;
    is followed_on_b($since, 20, @s), scalar(@s),
        'what A learned while refused reaches B once the store takes writes';
    cmp_ok count_in_log($a, qr/is back/), '>', $back, 'A says the store is back';
}

is_deeply [ $a->log_problems ], [], 'A: no alerts, crashes or sanitizer reports';
is_deeply [ grep { !/exited on signal 9/ } $b->log_problems ], [],
    'B: no alerts, crashes or sanitizer reports (but the workers killed)';

done_testing;
