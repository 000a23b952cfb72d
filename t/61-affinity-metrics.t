#!/usr/bin/env perl

# affinity_metrics: the module polls each server's own /metrics (vLLM's
# gauges, from the mock replicas) and counts the requests the engine runs
# and queues -- also those another nginx instance sent it.  Here a client
# that bypasses nginx keeps one replica busy: with affinity_metrics new
# sessions avoid it, without they do not.  A server whose metrics hang or
# are junk, or a page shorter than its Content-Length, changes nothing but
# its own figure, and says so once.  An engine that answers more slowly
# than the polling interval is asked once at a time.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes chat proxied_upstream
                    eventually engine_figures);

my $t = AffinityTest->new(workers => 2);
my @replicas = $t->start_mock_replicas(4, '--decode-ms-per-token', 100);
my $blind = $t->port;
my $status = $t->port;
my $faulty = $t->port;
my $junk = $t->port;
my ($hang) = $t->start_backends(1, delay_ms => 60_000);    # t/backend.pl
my $cut = $t->port;
my $whole = $t->port;
my $pages = metrics_pages($cut, $whole);
my $slow = $t->port;
my $slow_log = $t->path('logs/slow-metrics.log');
my $slow_pages = slow_metrics_page($slow, 0.6, $slow_log);

my $engine = "        affinity_metrics interval=200ms timeout=300ms;\n";
# Pages read on time whatever the machine's load: their only fault is the
# one under test.
my $patient = "        affinity_metrics interval=200ms timeout=3s;\n";

$t->write_conf(proxy_conf($t,
    servers(\@replicas) . "        session_affinity zone=seeing:1m;\n"
        . $engine,
    http => proxied_upstream(blind => servers(\@replicas)
                                      . "        session_affinity zone=blind:1m;",
                             $blind)
        . proxied_upstream(faulty => servers([ $replicas[0], $junk, $hang ])
                                     . "        session_affinity zone=faulty:1m;\n"
                                     . $engine, $faulty)
        . "    server {\n        listen 127.0.0.1:$junk;\n"
        . "        location = /metrics { return 200 'vllm:num_requests_running{ garbage\\n<html>'; }\n"
        . "        location / { return 200 'ok'; }\n    }\n"
        . proxied_upstream(cut => servers([$cut])
                                  . "        session_affinity zone=cut:1m;\n"
                                  . $patient, $t->port)
        . proxied_upstream(whole => servers([$whole])
                                    . "        session_affinity zone=whole:1m;\n"
                                    . $patient, $t->port)
        . proxied_upstream(slow => servers([$slow])
                                   . "        session_affinity zone=slow:1m;\n"
                                   . $patient, $t->port)
        . proxied_upstream(junk_patient => servers([$junk])
                                   . "        session_affinity zone=jp:1m;\n"
                                   . "        affinity_metrics path=/metrics-patient"
                                   . " interval=200ms timeout=3s;\n", $t->port)
        . "    server {\n        listen 127.0.0.1:$status;\n"
        . "        location / { affinity_status; }\n    }\n"));
$t->start_nginx;

my $json = JSON::PP->new;

sub engines { engine_figures($t, $status, $_[0]) }


ok eventually(sub { my $e = engines('llm');
                    4 == grep { defined $e->{$_} } @replicas }, 5),
    'every replica\'s own load is known';
is engines('llm')->{ $replicas[0] }{load}, 0, '... idle at first';
ok !defined engines('blind')->{ $replicas[0] },
    'an upstream without affinity_metrics polls nothing';

# ---- another client keeps replica 0 busy ----------------------------------

my $busy = $replicas[0];
my @socks;
for my $i (1 .. 24) {
    my $body = $json->encode({ model => 'm', stream => JSON::PP::true,
        max_tokens => 60, messages => [ { role => 'user',
                                          content => "elsewhere $i" } ] });
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $busy)
        or die "connect: $!";
    print {$s} "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        . "Content-Type: application/json\r\nContent-Length: "
        . length($body) . "\r\n\r\n$body";
    push @socks, $s;
}

ok eventually(sub { (engines('llm')->{$busy}{load} // 0) >= 20 }, 5),
    'the busy replica reports its load';
note 'engine load of the busy replica: ', engines('llm')->{$busy}{load};

sub place {
    my ($port, $prefix) = @_;
    my %on;
    for my $i (1 .. 40) {
        my $res = $t->http(POST => '/v1/chat/completions', port => $port,
            headers => { 'Content-Type' => 'application/json',
                         'X-Session-ID' => "$prefix-$i" },
            body => chat([ user => 'hi' ]) =~ s/"max_tokens":64/"max_tokens":1/r);
        $on{ $res->{headers}{'x-replica-port'} // 'none' }++;
    }
    return \%on;
}

my $seeing = place($t->listen_port, 'new');
my $without = place($blind, 'new');
note 'new sessions on the busy replica: ', $seeing->{$busy} // 0,
    ' with affinity_metrics, ', $without->{$busy} // 0, ' without';
is $seeing->{$busy} // 0, 0,
    'with affinity_metrics no new session goes to the busy replica';
cmp_ok $without->{$busy} // 0, '>=', 4,
    'without, the busy replica takes its share (the test can tell)';

close $_ for @socks;

# ---- servers whose metrics hang or are junk --------------------------------

my @res = map {
    $t->http(POST => '/v1/chat/completions', port => $faulty,
             headers => { 'Content-Type' => 'application/json',
                          'X-Session-ID' => "f-$_",
                          # the hanging server answers requests at once,
                          # only its metrics never come
                          'X-Delay-Ms' => 0 },
             body => chat([ user => 'hi' ]) =~ s/"max_tokens":64/"max_tokens":1/r)
} 1 .. 12;
my %served;
$served{ $_->{status} }++ for @res;
is_deeply \%served, { 200 => 12 }, 'requests to that upstream are served';

ok eventually(sub { defined engines('faulty')->{ $replicas[0] } }, 5),
    'the healthy server\'s figure is known';
my $e = engines('faulty');
ok !defined $e->{$junk} && !defined $e->{$hang},
    'the junk and the hanging servers have none';

# Logged once it is seen; a second later, a repeat would show.
sub logged {
    my ($pattern) = @_;
    return scalar(() = $t->error_log =~ /$pattern/g);
}
my $faults =
    qr/affinity: metrics of 127\.0\.0\.1:(?:$junk|$hang) in upstream "faulty"/;
ok eventually(sub { logged($faults) >= 1 }, 10), 'the faults are logged';
sleep 1;
my $n = logged($faults);
ok $n <= 2, "logged once per worker ($n)";

# ---- a page shorter than its Content-Length --------------------------------

# The same page, whole and cut short: the whole one is read, the cut one is
# not (its counters would seem to step back).
ok eventually(sub { (engines('whole')->{$whole}{load} // 0) == 12 }, 5),
    'a whole page is read';
ok !defined engines('cut')->{$cut}, 'a page cut short is not';
my $truncated =
    qr/metrics of 127\.0\.0\.1:$cut in upstream "cut": truncated reply/;
ok eventually(sub { logged($truncated) >= 1 }, 10),
    'a truncated reply is logged';
sleep 1;
$n = logged($truncated);
ok $n <= 2, "truncated reply logged once per worker ($n)";
kill 'TERM', $pages;
waitpid $pages, 0;

# ---- an engine slower than the polling interval ----------------------------

# It answers 0.6 s after it is asked, and the polls come every 0.2 s:
# while an answer is owed the engine is not asked again (or, asked by
# another worker in the same moment, that ask is dropped: its connection
# closed at once), so that the news counted since the first ask goes with
# the answer to it.  The asks it answered never overlapped.
ok eventually(sub { (engines('slow')->{$slow}{load} // 0) == 12 }, 5),
    'a slow engine\'s figure is read';
# Asked every 0.2 s: four asks take about a second, where an ask held back
# for the 3 s timeout would make them take more than 9.
my $patient_asks = sub {
    scalar(() = $t->access_log =~ m{"GET /metrics-patient }g);
};
my ($asked, $since) = ($patient_asks->(), time);
ok eventually(sub { $patient_asks->() >= $asked + 4 }, 20),
    'an engine whose answers are junk is asked again';
my $took = time - $since;
note sprintf 'four asks took %.1f s', $took;
cmp_ok $took, '<', 6,
    'an ask that got junk does not hold the next back for its timeout';
kill 'TERM', $slow_pages;
waitpid $slow_pages, 0;
my (@answered, $dropped);
open my $fh, '<', $slow_log or die "$slow_log: $!";
while (<$fh>) {
    push @answered, [ $1, $2 ] if /^answered (\S+) (\S+)/;
    $dropped++ if /^dropped/;
}
close $fh;
my $overlaps = grep { $answered[$_][0] < $answered[ $_ - 1 ][1] }
               1 .. $#answered;
note scalar(@answered), ' asks answered, ', $dropped // 0, ' dropped';
cmp_ok scalar(@answered), '>=', 2, 'the slow engine is asked again';
is $overlaps, 0, 'no ask waits beside another';

is_deeply [ $t->log_problems ], [], 'no alerts, crashes or sanitizer reports';

done_testing;

# slow_metrics_page($port, $delay, $log) - a process answering each request
# for a vLLM metrics page $delay seconds after it came, unless the client
# closed first.  It writes "answered ASKED ANSWERED" (times) or "dropped"
# for each to $log, in the order they ended.  Returns its pid.
sub slow_metrics_page {
    my ($port, $delay, $log) = @_;
    my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
                                  Listen => 16, ReuseAddr => 1)
        or die "listen on $port: $!";
    my $pid = fork // die "fork: $!";
    return $pid if $pid;

    $SIG{TERM} = sub { POSIX::_exit(0) };
    open my $out, '>', $log or POSIX::_exit(1);
    $out->autoflush(1);
    my $parent = getppid;
    my $page = qq{vllm:num_requests_running{model_name="m"} 12\n};
    my %asked;      # fileno => [ socket, time its request came, head ]
    my $select = IO::Select->new($l);
    while (getppid == $parent) {
        for my $r ($select->can_read(0.02)) {
            if ($r == $l) {
                my $c = $l->accept or next;
                $select->add($c);
                $asked{ fileno $c } = [ $c, undef, '' ];
                next;
            }
            my $a = $asked{ fileno $r };
            my $got = sysread $r, $a->[2], 4096, length $a->[2];
            if (!$got) {
                print {$out} "dropped\n" if defined $a->[1];
                delete $asked{ fileno $r };
                $select->remove($r);
                close $r;
                next;
            }
            $a->[1] //= time if $a->[2] =~ /\r\n\r\n/;
        }
        for my $fd (keys %asked) {
            my ($c, $at) = @{ $asked{$fd} };
            next unless defined $at && time >= $at + $delay;
            syswrite $c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                         . "Content-Length: " . length($page) . "\r\n\r\n$page";
            printf {$out} "answered %.3f %.3f\n", $at, time;
            delete $asked{$fd};
            $select->remove($c);
            close $c;
        }
    }
    POSIX::_exit(0);
}

# metrics_pages($cut, $whole) - a process serving the same vLLM metrics
# page on two ports, whole on $whole and with a Content-Length 4,000 bytes
# longer than the page on $cut, then closing the connection.  Returns its
# pid.
sub metrics_pages {
    my ($cut, $whole) = @_;
    my @listen = map {
        IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $_,
                              Listen => 16, ReuseAddr => 1)
            or die "listen on $_: $!"
    } $cut, $whole;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;

    # Killed, exit at once: the test's END blocks are the parent's.
    $SIG{TERM} = sub { POSIX::_exit(0) };
    my $parent = getppid;
    my $page = qq{vllm:num_requests_running{model_name="m"} 7\n}
             . qq{vllm:num_requests_waiting{model_name="m"} 5\n};
    my $select = IO::Select->new(@listen);
    while (getppid == $parent) {
        for my $l ($select->can_read(1)) {
            my $c = $l->accept or next;
            my $head = '';
            while ($head !~ /\r\n\r\n/) {
                my $got = sysread $c, $head, 4096, length $head;
                last unless $got;
            }
            my $length = length($page)
                         + ($l->sockport == $cut ? 4000 : 0);
            syswrite $c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                         . "Content-Length: $length\r\n\r\n$page";
            close $c;
        }
    }
    POSIX::_exit(0);
}
