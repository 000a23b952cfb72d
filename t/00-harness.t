#!/usr/bin/env perl

# Self-test of the test harness (t/lib/AffinityTest.pm), the mock backend
# (t/backend.pl) and the mock DNS server (t/dns.pl), using plain nginx
# round-robin and nginx's resolver without the module.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(time);

use AffinityTest;
use AffinityConf qw(eventually);

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

# Sends one raw UDP packet to the DNS server, returns the reply or undef if
# none came within $timeout seconds.
sub dns_exchange {
    my ($port, $packet, $timeout) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
        Proto => 'udp') or die "udp socket: $!";
    send($sock, $packet, 0) or die "send: $!";
    return undef unless IO::Select->new($sock)->can_read($timeout // 1);
    recv($sock, my $reply, 65535, 0);
    return $reply;
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
    is $res->{headers}{'x-delayed-ms'}, 300, '... and is reported';
    $res = $t->http(GET => '/', port => $slow, headers => { 'X-Delay-Ms' => 0 });
    is $res->{headers}{'x-delayed-ms'}, 0, 'X-Delay-Ms overrides the default';

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

    # A client that disconnects while its request waits must not hurt: the
    # request is taken, then completes.
    my $taken = $t->backend_stats($slow)->{requests};
    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $slow);
    print {$sock} "GET / HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 100\r\n\r\n";
    close $sock;
    ok eventually(sub {
        my $s = $t->backend_stats($slow);
        return $s->{requests} == $taken + 1 && $s->{inflight} == 0;
    }, 10), 'early disconnect: request completed';

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

# --- other loopback addresses, DNS ------------------------------------------

# Two backends sharing a port on other addresses, as a DNS name's servers.
my $shared = $t->port;
my $at3 = $t->start_backend_at('127.0.0.3', $shared);
my $at4 = $t->start_backend_at('127.0.0.4', $shared);
my $dns = $t->start_dns('app.test' => ['127.0.0.3', '127.0.0.4'], 'empty.test' => []);

subtest 'backend on another address' => sub {
    is $at3, "127.0.0.3:$shared", 'key is ADDR:PORT';
    is_deeply [$t->backend_keys], [(sort { $a <=> $b } @all), $at3, $at4], 'backend_keys';
    is_deeply [$t->backend_ports], [sort { $a <=> $b } @all], 'backend_ports: 127.0.0.1 only';

    my $res = $t->http(GET => '/x', port => $at3);
    is $res->{status}, 200, 'status';
    is $res->{body}, "127.0.0.3:$shared\n", 'body is ADDR:PORT';
    is $res->{headers}{'x-backend-port'}, $shared, 'X-Backend-Port';
    is $res->{headers}{'x-backend-addr'}, "127.0.0.3:$shared", 'X-Backend-Addr';
    $res = $t->http(GET => '/x', host => '127.0.0.4', port => $shared);
    is $res->{body}, "127.0.0.4:$shared\n", 'host option';
    ok !exists $t->http(GET => '/', port => $fast1)->{headers}{'x-backend-addr'},
        'no X-Backend-Addr on 127.0.0.1';
    is $t->http(GET => '/', port => $shared)->{status}, 0, 'nothing on 127.0.0.1:shared';

    my $stats = $t->backend_stats($at3);
    is_deeply [@$stats{qw(port addr requests)}], [$shared, '127.0.0.3', 1], 'stats';
    ok $t->backend_reset($at3), 'reset';
    is $t->backend_stats($at3)->{requests}, 0, 'reset worked';

    $t->stop_backend($at4);
    is $t->http(GET => '/', port => $at4)->{status}, 0, 'stopped: refuses connections';
    is $t->http(GET => '/', port => $at3)->{status}, 200, 'the other address still answers';
    is $t->start_backend($at4), $at4, 'restarted by key';
    is $t->http(GET => '/', port => $at4)->{body}, "127.0.0.4:$shared\n", 'answers again';
};

subtest 'dns server' => sub {
    is $t->dns_port, $dns, 'dns_port';

    my $r = $t->dns_query('app.test');
    is $r->{rcode}, 'NOERROR', 'A: NOERROR';
    is sprintf('%04x', $r->{flags}), '8580', 'QR AA RD RA set';
    is $r->{question}, 'app.test', 'question echoed';
    is_deeply $r->{addrs}, ['127.0.0.3', '127.0.0.4'], 'both addresses';
    is_deeply $r->{ttls}, [1, 1], 'TTL 1';

    is_deeply $t->dns_query('APP.Test.')->{addrs}, ['127.0.0.3', '127.0.0.4'],
        'case and trailing dot ignored';
    $r = $t->dns_query('app.test', type => 'AAAA');
    is_deeply [@$r{qw(rcode answers)}], ['NOERROR', 0], 'AAAA: NOERROR, no answers';
    $r = $t->dns_query('app.test', type => 15);
    is_deeply [@$r{qw(rcode answers)}], ['NOERROR', 0], 'MX: NOERROR, no answers';
    $r = $t->dns_query('empty.test');
    is_deeply [@$r{qw(rcode answers)}], ['NOERROR', 0], 'name without addresses';
    $r = $t->dns_query('missing.test');
    is_deeply [@$r{qw(rcode answers)}], ['NXDOMAIN', 0], 'unknown name: NXDOMAIN';
    is sprintf('%04x', $r->{flags}), '8583', 'NXDOMAIN flags';

    ok $t->set_dns('app.test' => '127.0.0.4', 'new.test' => ['127.0.0.5', '127.0.0.6']),
        'set_dns';
    is_deeply $t->dns_query('app.test')->{addrs}, ['127.0.0.4'], 'changed at once';
    is_deeply $t->dns_query('new.test')->{addrs}, ['127.0.0.5', '127.0.0.6'], 'name added';
    is $t->dns_query('empty.test')->{rcode}, 'NXDOMAIN', 'name left out is gone';
    ok !eval { $t->set_dns('x.test' => '1.2.3'); 1 }, 'bad address refused';
    like $@, qr/bad IPv4 address/, 'with a message';
    ok !eval { $t->start_dns('y.test' => '1.2.3.4'); 1 }, 'only one DNS server';

    # Malformed packets are ignored or refused, never fatal.
    my $query = sub { pack('n n n n n n', 7, @_[0, 1], 0, 0, 0) . $_[2] };
    my $q = "\3app\4test\0" . pack('n n', 1, 1);
    is dns_exchange($dns, "\0\1\2", 0.3), undef, 'short packet ignored';
    is dns_exchange($dns, $query->(0x8000, 1, $q), 0.3), undef, 'response ignored';
    my $reply = dns_exchange($dns, $query->(0x0100, 1, "\xc0\x0c" . pack('n n', 1, 1)));
    is length($reply) && unpack('x2 n', $reply) & 0xf, 1, 'compression pointer: FORMERR';
    $reply = dns_exchange($dns, $query->(0x0100, 1, "\3app\7te"));
    is length($reply) && unpack('x2 n', $reply) & 0xf, 1, 'truncated name: FORMERR';
    $reply = dns_exchange($dns, $query->(0x0100, 2, $q . $q));
    is length($reply) && unpack('x2 n', $reply) & 0xf, 1, 'two questions: FORMERR';
    $reply = dns_exchange($dns, $query->(0x1100, 1, $q));
    is length($reply) && unpack('x2 n', $reply) & 0xf, 4, 'opcode 2: NOTIMP';
    $reply = dns_exchange($dns, $query->(0x0000, 1, "\3app\4test\0" . pack('n n', 1, 3)));
    is length($reply) && unpack('x2 n', $reply), 0x8485, 'class CH: REFUSED, RD not set';
    is_deeply $t->dns_query('app.test')->{addrs}, ['127.0.0.4'], 'still answering';

    $t->stop_dns;
    is $t->dns_port, undef, 'stopped';
    my $none = $t->dns_query('app.test', port => $dns, timeout => 0.3);
    ok !defined $none->{rcode} && $none->{error}, "no answer ($none->{error})";
    is $t->start_dns({ port => $dns, ttl => 5 }, 'app.test' => '127.0.0.3'), $dns,
        'restarted on the same port';
    is_deeply $t->dns_query('app.test')->{ttls}, [5], 'with another TTL';

    $t->set_dns('app.test' => ['127.0.0.3', '127.0.0.4']);
};

# --- nginx ----------------------------------------------------------------

my $listen = $t->listen_port;
my $dns_listen = $t->port;
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

    # nginx's resolver against t/dns.pl: a variable host is resolved per request.
    resolver 127.0.0.1:$dns valid=1s;
    server {
        listen 127.0.0.1:$dns_listen;
        location / {
            set \$dns_host app.test;
            proxy_pass http://\$dns_host:$shared;
        }
    }
EOF

like $t->nginx_version, qr/^\d+\.\d+\.\d+$/, 'nginx_version';
ok $t->nginx_at_least('1.0'), 'nginx_at_least an old version';
ok !$t->nginx_at_least('999.0.0'), 'not a future one';

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

# Releases what a backend holds once it holds $n requests at once, from a
# child process; its exit code is 0 if it held them all.
sub release_when_held {
    my ($port, $n) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $deadline = time + 30;
        select undef, undef, undef, 0.05
            until $t->backend_stats($port)->{held} >= $n || time > $deadline;
        my $held = $t->backend_stats($port)->{held};
        $t->backend_release($port);
        POSIX::_exit($held >= $n ? 0 : 1);
    }
    return $pid;
}

subtest 'parallel' => sub {
    # Requests held until all are in flight: they ran concurrently.
    $t->backend_reset($slow);
    my $releaser = release_when_held($slow, 50);
    my @res = $t->parallel([ map { { method => 'GET', path => "/slow/$_",
        headers => [ 'X-Hold' => 1 ] } } 1 .. 50 ]);
    waitpid $releaser, 0;
    is $?, 0, 'all 50 in flight together';

    is scalar(@res), 50, '50 responses';
    is scalar(grep { $_->{status} == 200 && $_->{body} eq "$slow\n" } @res), 50,
        'all answered by the slow backend';

    my $stats = $t->backend_stats($slow);
    is $stats->{max_inflight}, 50, 'max_inflight';
    is $stats->{requests}, 50, 'requests';
    is $stats->{inflight}, 0, 'nothing left in flight';

    # 200 at once, directly to a backend.
    $t->backend_reset($fast2);
    $releaser = release_when_held($fast2, 200);
    @res = $t->parallel([ map { { path => "/$_", port => $fast2,
        headers => [ 'X-Hold' => 1 ] } } 1 .. 200 ]);
    waitpid $releaser, 0;
    is $?, 0, 'all 200 in flight together';
    is scalar(grep { $_->{status} == 200 } @res), 200, '200 simultaneous requests';
    is $t->backend_stats($fast2)->{max_inflight}, 200, 'max_inflight';
};

subtest 'held and tagged requests' => sub {
    # Held until released, however long that takes; counted by X-Tag.
    my @tags = ('a', 'a', 'b', undef);
    my @socks = map {
        my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                         PeerPort => $fast1)
            or die "connect $fast1: $!";
        my $tag = defined $_ ? "X-Tag: $_\r\n" : '';
        print {$sock} "GET /held HTTP/1.1\r\nHost: x\r\nX-Hold: 1\r\n"
            . "${tag}Connection: close\r\n\r\n";
        $sock;
    } @tags;

    my $stats;
    my $deadline = time + 10;
    until (($stats = $t->backend_stats($fast1))->{held} == 4 || time > $deadline) {
        select undef, undef, undef, 0.05;
    }
    is $stats->{held}, 4, 'four requests held';
    is $stats->{inflight}, 4, 'held requests are in flight';
    is_deeply $t->backend_tags($fast1), { a => 2, b => 1 }, 'in flight by X-Tag';

    is $t->backend_release($fast1), 4, 'four released';
    for my $sock (@socks) {
        local $/;
        like <$sock>, qr{^HTTP/1\.1 200.*\r\n\r\n$fast1\n\z}s, 'answered once released';
    }
    $stats = $t->backend_stats($fast1);
    is $stats->{held}, 0, 'none held';
    is $stats->{inflight}, 0, 'none in flight';
    is_deeply $t->backend_tags($fast1), {}, 'no tags left';
    is $t->backend_release($fast1), 0, 'nothing to release';
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

subtest 'nginx resolver' => sub {
    my $ask = sub {
        my %seen;
        for my $i (1 .. $_[0]) {
            my $res = $t->http(GET => "/dns/$i", port => $dns_listen);
            $seen{ $res->{status} == 200 ? $res->{body} : "status $res->{status}" }++;
        }
        return \%seen;
    };
    # Waits (up to 10 s) until 10 requests in a row see only @want.
    my $settles = sub {
        my (@want) = @_;
        my $deadline = time + 10;
        while (time < $deadline) {
            my $seen = $ask->(10);
            return 1 if !grep { my $k = $_; !grep { $_ eq $k } @want } keys %$seen;
            select undef, undef, undef, 0.2;
        }
        return 0;
    };

    my $seen = $ask->(30);
    is_deeply [sort keys %$seen], ["127.0.0.3:$shared\n", "127.0.0.4:$shared\n"],
        'both resolved addresses used';

    $t->set_dns('app.test' => ['127.0.0.4']);
    ok $settles->("127.0.0.4:$shared\n"), 'one address left: only it is used';

    $t->set_dns();
    ok $settles->('status 502'), 'NXDOMAIN: 502';

    $t->set_dns('app.test' => ['127.0.0.3']);
    ok $settles->("127.0.0.3:$shared\n"), 'back: the new address is used';

    my @bad = grep { /invalid .*DNS response|unexpected .*DNS response|short DNS response/ }
        split /\n/, $t->error_log;
    is_deeply \@bad, [], 'nginx accepted every DNS response' or diag join "\n", @bad;
    like $t->error_log, qr/app\.test could not be resolved \(3: Host not found\)/,
        'nginx saw the NXDOMAIN';
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
