#!/usr/bin/env perl

# Self-test of the test harness (t/lib/AffinityTest.pm) and the mock backend
# (t/backend.pl), using plain nginx round-robin without the module.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(time);

use AffinityTest;

my $t = AffinityTest->new(no_module => 1);

# Sends raw bytes straight to a port, returns everything read until EOF.
sub raw_exchange {
    my ($port, $data) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port)
        or die "connect $port: $!";
    print {$sock} $data;
    local $/;
    my $reply = <$sock>;
    return $reply // '';
}

sub ports_seen {
    my (@responses) = @_;
    my %seen;
    $seen{ $_->{headers}{'x-backend-port'} // 'none' }++ for @responses;
    return \%seen;
}

# --- backends -------------------------------------------------------------

my ($fast1, $fast2) = $t->start_backends(2, delay_ms => 0);
my ($slow)          = $t->start_backends(1, delay_ms => 300);
my @all = ($fast1, $fast2, $slow);

is scalar(keys %{ { map { $_ => 1 } @all, $t->listen_port } }), 4, 'all ports distinct';

subtest 'backend direct' => sub {
    my $res = $t->http(GET => '/hello', port => $fast1);
    is $res->{status}, 200, 'status';
    is $res->{body}, "$fast1\n", 'body is the port';
    is $res->{headers}{'x-backend-port'}, $fast1, 'X-Backend-Port';
    is $res->{headers}{'content-type'}, 'text/plain', 'Content-Type';
    is $res->{headers}{'content-length'}, length("$fast1\n"), 'Content-Length';

    my $start = time;
    $res = $t->http(GET => '/', port => $slow);
    cmp_ok time - $start, '>=', 0.29, 'default delay applies';
    $start = time;
    $res = $t->http(GET => '/', port => $slow, headers => { 'X-Delay-Ms' => 0 });
    cmp_ok time - $start, '<', 0.25, 'X-Delay-Ms overrides the default';

    $res = $t->http(POST => '/post', port => $fast1, body => 'x' x 100_000);
    is $res->{body}, "$fast1\n", 'Content-Length request body';

    # Keep-alive with a chunked body, then a pipelined request closing it.
    my $reply = raw_exchange($fast1,
        "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        . "5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n"
        . "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    my @statuses = $reply =~ m{^HTTP/1\.1 (\d+)}mg;
    is_deeply \@statuses, [200, 200], 'chunked body + keep-alive + pipelining';

    $reply = raw_exchange($fast1, "GET /c HTTP/1.0\r\n\r\n");
    like $reply, qr{^HTTP/1\.1 200.*\r\n\r\n$fast1\n\z}s, 'HTTP/1.0 request, closed after response';

    $reply = raw_exchange($fast1, "nonsense\r\n\r\n");
    like $reply, qr{^HTTP/1\.1 400}, 'malformed request gets 400';

    # A client that disconnects while its request waits must not hurt.
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $slow);
    print {$sock} "GET / HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 100\r\n\r\n";
    close $sock;
    select undef, undef, undef, 0.3;
    is $t->backend_stats($slow)->{inflight}, 0, 'early disconnect: request completed';

    ok $t->backend_reset($fast1), 'reset';
    $t->http(GET => '/', port => $fast1) for 1 .. 3;
    my $stats = $t->backend_stats($fast1);
    is $stats->{requests}, 3, 'requests counted, /__stats and /__reset not';
    is $stats->{inflight}, 0, 'nothing in flight';
    is $stats->{max_inflight}, 1, 'max_inflight';

    my $closed = $t->http(GET => '/', port => $t->port);
    is $closed->{status}, 0, 'connection refused gives status 0';
    ok $closed->{error}, "with an error ($closed->{error})";
};

# --- nginx ----------------------------------------------------------------

my $listen = $t->listen_port;
my $servers = join '', map { "        server 127.0.0.1:$_;\n" } @all;

$t->write_conf(<<"EOF", no_module => 1);
    upstream rr {
$servers    }

    server {
        listen 127.0.0.1:$listen;

        location / {
            proxy_pass http://rr;
        }
        location /slow/ {
            proxy_pass http://127.0.0.1:$slow;
        }
        location /ka/ {
            proxy_pass http://keepalive;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering off;
        }
        location /cookie {
            add_header Set-Cookie "a=1";
            add_header Set-Cookie "b=2";
            return 200 "cookies\\n";
        }
    }

    upstream keepalive {
        server 127.0.0.1:$fast1;
        keepalive 8;
    }
EOF

my ($code, $out) = $t->nginx_test;
is $code, 0, 'nginx -t succeeds' or diag $out;
like $out, qr/syntax is ok/, 'nginx -t output';

ok $t->start_nginx, 'nginx started';
ok $t->master_pid, 'master pid known';
is scalar(my @w = $t->worker_pids), 4, '4 workers';

subtest 'round robin' => sub {
    my @res = map { $t->http(GET => "/rr/$_", headers => { 'X-Delay-Ms' => 0 }) } 1 .. 30;
    is scalar(grep { $_->{status} == 200 } @res), 30, 'all 200';
    is scalar(grep { $_->{body} eq "$_->{headers}{'x-backend-port'}\n" } @res), 30,
        'body matches X-Backend-Port';
    my $seen = ports_seen(@res);
    ok $seen->{$_}, "port $_ used" for @all;
    is scalar(keys %$seen), 3, 'only the three backends';
};

subtest 'parallel' => sub {
    $t->backend_reset($slow);
    my $start = time;
    my @res = $t->parallel([ map { { method => 'GET', path => "/slow/$_" } } 1 .. 50 ]);
    my $elapsed = time - $start;

    is scalar(@res), 50, '50 responses';
    is scalar(grep { $_->{status} == 200 && $_->{body} eq "$slow\n" } @res), 50,
        'all answered by the slow backend';
    cmp_ok $elapsed, '<', 5, sprintf('ran concurrently (%.2f s)', $elapsed);

    my $stats = $t->backend_stats($slow);
    cmp_ok $stats->{max_inflight}, '>=', 40, "max_inflight $stats->{max_inflight} >= 40";
    is $stats->{requests}, 50, 'requests';
    is $stats->{inflight}, 0, 'nothing left in flight';

    # 200 at once, directly to a backend.
    $t->backend_reset($fast2);
    @res = $t->parallel([ map { { path => "/$_", port => $fast2,
        headers => [ 'X-Delay-Ms' => 500 ] } } 1 .. 200 ]);
    is scalar(grep { $_->{status} == 200 } @res), 200, '200 simultaneous requests';
    is $t->backend_stats($fast2)->{max_inflight}, 200, 'all 200 in flight together';
};

subtest 'http client' => sub {
    my $res = $t->http(GET => '/cookie');
    is_deeply $res->{set_cookie}, ['a=1', 'b=2'], 'set_cookie list';
    is $res->{headers}{'set-cookie'}, "a=1\nb=2", 'repeated header joined with newline';

    # nginx sends a chunked body upstream over HTTP/1.1 keep-alive.
    $res = $t->http(POST => '/ka/x',
        headers => [ 'Transfer-Encoding' => 'chunked' ],
        body    => "4\r\nabcd\r\n0\r\n\r\n");
    is $res->{status}, 200, 'chunked request through keep-alive upstream';
    is $res->{body}, "$fast1\n", 'answered';
    $res = $t->http(POST => '/ka/y', body => 'plain body');
    is $res->{body}, "$fast1\n", 'second request on keep-alive upstream';
};

subtest 'stopped backend is skipped' => sub {
    $t->stop_backend($fast2);
    is $t->http(GET => '/', port => $fast2)->{status}, 0, 'port refuses connections';

    my @res = map { $t->http(GET => "/down/$_", headers => { 'X-Delay-Ms' => 0 }) } 1 .. 30;
    is scalar(grep { $_->{status} == 200 } @res), 30, 'all 200';
    my $seen = ports_seen(@res);
    ok !$seen->{$fast2}, 'stopped backend not used';
    ok $seen->{$fast1} && $seen->{$slow}, 'the others are';

    $t->start_backend($fast2);
    is $t->http(GET => '/', port => $fast2)->{body}, "$fast2\n", 'restarted on the same port';
};

subtest 'reload' => sub {
    my $master = $t->master_pid;
    my %old = map { $_ => 1 } $t->worker_pids;

    ok $t->reload_nginx, 'reload finished';
    is $t->master_pid, $master, 'same master';
    my @new = $t->worker_pids;
    is scalar(@new), 4, '4 workers';
    ok !(grep { $old{$_} } @new), 'all workers replaced';

    # Fresh workers have no memory of the failed backend.
    my @res = map { $t->http(GET => "/after/$_", headers => { 'X-Delay-Ms' => 0 }) } 1 .. 30;
    is scalar(grep { $_->{status} == 200 } @res), 30, 'all 200 after reload';
    my $seen = ports_seen(@res);
    ok $seen->{$_}, "port $_ used" for @all;
};

$t->stop_nginx;
ok !$t->master_pid, 'nginx stopped';
is $t->http(GET => '/')->{status}, 0, 'listen port closed';

my @problems = $t->log_problems;
is_deeply \@problems, [], 'no alert/crit/emerg in error.log' or diag join "\n", @problems;

done_testing;
