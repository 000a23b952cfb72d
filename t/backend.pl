#!/usr/bin/env perl

=head1 NAME

backend.pl - mock HTTP backend for the upstream affinity test suite

=head1 SYNOPSIS

    perl t/backend.pl --port 8081 [--host 127.0.0.1] [--delay-ms 0] [--pidfile FILE]
                      [--watch-pid PID]

=head1 DESCRIPTION

A single-process, single-threaded HTTP/1.x server built on a non-blocking
IO::Select event loop.  It listens on ADDR:PORT (ADDR is 127.0.0.1 unless
C<--host> says otherwise) and can serve hundreds of concurrent connections.

Every request (except the special paths below) is answered, after a delay,
with C<200>, the headers C<X-Backend-Port: PORT>, C<X-Delayed-Ms> (the
delay it applied), C<Content-Type: text/plain>
and C<Content-Length>, and the body C<"PORT\n">.  A backend listening on an
address other than 127.0.0.1 (several can then share a port, as the servers
a DNS name resolves to do) also sends C<X-Backend-Addr: ADDR:PORT>, and its
body is C<"ADDR:PORT\n"> instead.  The delay is taken from the
C<X-Delay-Ms> request header if present, otherwise from C<--delay-ms>.
Delays are event-loop timers, so many requests can wait at the same time.

A request counts as in-flight from the moment it has been fully read until
its response is queued.  A client that goes away while its request waits
does not shorten the wait (like a real backend that keeps working).

A request with an C<X-Hold> header waits, with no delay of its own, until
C</__release> is asked: a test can hold requests in flight for as long as
it needs, whatever the machine's speed.  A request with an C<X-Tag> header
is counted under that tag while in flight (a proxy can send C<$pid> there:
which worker holds which requests).

Request bodies may use Content-Length or chunked transfer encoding.
HTTP/1.1 connections are kept alive unless the client sends
C<Connection: close>; HTTP/1.0 connections are kept alive only when the
client sends C<Connection: keep-alive>.

Special paths (answered at once, not counted as requests):

    /__stats   body "port=P inflight=N max_inflight=N requests=N held=N\n",
               with " tags=TAG:N,TAG:N" (the requests in flight by X-Tag,
               when any has one) and " addr=ADDR" (when ADDR is not
               127.0.0.1) before the newline
    /__reset   zero max_inflight and requests (inflight is kept), body "ok\n"
    /__release answer every held request now, body "released N\n"

Options:

    --port PORT       port to listen on (required)
    --host ADDR       IPv4 address to listen on (default 127.0.0.1); on Linux
                      every address in 127.0.0.0/8 is local
    --delay-ms MS     default response delay (default 0)
    --pidfile FILE    write the process id to FILE (removed on exit)
    --watch-pid PID   exit when process PID no longer exists

The server exits cleanly on SIGTERM or SIGINT.

=cut

use strict;
use warnings;

use Errno qw(EAGAIN EWOULDBLOCK EINTR EADDRINUSE);
use Getopt::Long qw(GetOptions);
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);

use constant {
    READ_SIZE       => 65536,
    MAX_HEADER_SIZE => 65536,
    LISTEN_BACKLOG  => 1024,
};

my %opt = (delay_ms => 0, host => '127.0.0.1');
GetOptions(
    'port=i'      => \$opt{port},
    'host=s'      => \$opt{host},
    'delay-ms=i'  => \$opt{delay_ms},
    'pidfile=s'   => \$opt{pidfile},
    'watch-pid=i' => \$opt{watch_pid},
) or die "usage: $0 --port PORT [--host ADDR] [--delay-ms MS] [--pidfile FILE] "
       . "[--watch-pid PID]\n";
die "$0: --port is required\n" unless $opt{port};

my $PORT = $opt{port};
my $HOST = $opt{host};

# What identifies this backend in its responses: the port alone on the
# default address (as always), "ADDR:PORT" on any other.
my $DEFAULT_HOST = $HOST eq '127.0.0.1';
my $IDENTITY     = $DEFAULT_HOST ? $PORT : "$HOST:$PORT";

my %stats = (inflight => 0, max_inflight => 0, requests => 0);
my %tags;      # X-Tag => requests in flight with it

my %conns;     # "$sock" => connection state
my @timers;    # [deadline, connection] for delayed responses
my @held;      # connections whose request waits for /__release
my $running = 1;

$SIG{PIPE} = 'IGNORE';
$SIG{TERM} = $SIG{INT} = sub { $running = 0 };

my $listener = listen_socket($HOST, $PORT);
my $rsel     = IO::Select->new($listener);
my $wsel     = IO::Select->new;

if (defined $opt{pidfile}) {
    open my $fh, '>', $opt{pidfile} or die "$0: cannot write $opt{pidfile}: $!\n";
    print {$fh} "$$\n";
    close $fh;
}

while ($running) {
    my ($readable, $writable) = IO::Select->select($rsel, $wsel, undef, next_timeout());

    for my $fh (@{ $readable || [] }) {
        if ($fh == $listener) {
            accept_all();
        }
        elsif (my $c = $conns{"$fh"}) {
            on_readable($c);
        }
    }
    for my $fh (@{ $writable || [] }) {
        my $c = $conns{"$fh"} or next;
        on_writable($c);
    }
    fire_timers();

    $running = 0 if $opt{watch_pid} && !kill(0, $opt{watch_pid});
}

close_conn($_) for values %conns;
close $listener;
unlink $opt{pidfile} if defined $opt{pidfile};
exit 0;

# ---------------------------------------------------------------------------
# Sockets and the event loop

sub listen_socket {
    my ($host, $port) = @_;

    # Retry for a while: the port may briefly still be held after a restart.
    my $deadline = time + 5;
    while (1) {
        my $sock = IO::Socket::INET->new(
            LocalAddr => $host,
            LocalPort => $port,
            Proto     => 'tcp',
            Listen    => LISTEN_BACKLOG,
            ReuseAddr => 1,
        );
        if ($sock) {
            $sock->blocking(0);
            return $sock;
        }
        die "$0: cannot listen on $host:$port: $!\n"
            unless $! == EADDRINUSE && time < $deadline;
        select(undef, undef, undef, 0.1);
    }
}

sub next_timeout {
    my $timeout = 1;    # wake up regularly to notice signals and --watch-pid
    my $now     = time;
    for my $t (@timers) {
        my $left = $t->[0] - $now;
        $timeout = $left if $left < $timeout;
    }
    return $timeout < 0 ? 0 : $timeout;
}

sub fire_timers {
    return unless @timers;
    my $now = time;
    my (@due, @later);
    for my $t (@timers) {
        if   ($t->[0] <= $now) { push @due,   $t }
        else                   { push @later, $t }
    }
    @timers = @later;
    for my $t (sort { $a->[0] <=> $b->[0] } @due) {
        finish_request($t->[1]);
    }
}

sub accept_all {
    while (my $sock = $listener->accept) {
        $sock->blocking(0);
        setsockopt($sock, IPPROTO_TCP, TCP_NODELAY, 1);
        $conns{"$sock"} = {
            sock      => $sock,
            in        => '',
            out       => '',
            state     => 'read',    # read -> wait -> write -> read ...
            keepalive => 0,
            eof       => 0,
        };
        $rsel->add($sock);
    }
}

sub on_readable {
    my ($c) = @_;

    my $n = sysread($c->{sock}, $c->{in}, READ_SIZE, length $c->{in});
    if (!defined $n) {
        return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
        close_conn($c);
        return;
    }
    if ($n == 0) {
        # Peer closed (or half-closed) its side.  A request that is already
        # waiting or being answered still completes; anything else is over.
        $c->{eof} = 1;
        $rsel->remove($c->{sock});
        close_conn($c) if $c->{state} eq 'read';
        return;
    }
    process_input($c) if $c->{state} eq 'read';
}

sub on_writable {
    my ($c) = @_;

    while (length $c->{out}) {
        my $n = syswrite($c->{sock}, $c->{out});
        if (!defined $n) {
            return if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
            close_conn($c);
            return;
        }
        substr($c->{out}, 0, $n, '');
    }

    $wsel->remove($c->{sock});
    if ($c->{keepalive} && !$c->{eof}) {
        $c->{state} = 'read';
        process_input($c);    # a pipelined request may already be buffered
    }
    else {
        close_conn($c);
    }
}

sub close_conn {
    my ($c) = @_;
    return if $c->{closed};
    $c->{closed} = 1;

    if ($c->{state} eq 'wait') {
        # Read error while the request was waiting: drop it.
        @timers = grep { $_->[1] != $c } @timers;
        @held = grep { $_ != $c } @held;
        request_ended($c);
    }
    $rsel->remove($c->{sock});
    $wsel->remove($c->{sock});
    delete $conns{ "$c->{sock}" };
    close $c->{sock};
}

# ---------------------------------------------------------------------------
# HTTP parsing

sub process_input {
    my ($c) = @_;

    my $req = eval { parse_request(\$c->{in}) };
    if ($@) {
        chomp(my $err = $@);
        $c->{keepalive} = 0;
        queue_response($c, 400, "bad request: $err\n");
        return;
    }
    return unless $req;    # need more data

    $c->{keepalive} = $req->{keepalive};
    handle_request($c, $req);
}

# Removes one complete request from $$buf and returns it, returns undef if
# more data is needed, dies on malformed input.
sub parse_request {
    my ($buf) = @_;

    $$buf =~ s/\A(?:\r?\n)+//;    # tolerate stray empty lines between requests
    if ($$buf !~ /\r?\n\r?\n/) {
        die "header too large\n" if length $$buf > MAX_HEADER_SIZE;
        return;
    }
    my $head_len = $+[0];
    die "header too large\n" if $head_len > MAX_HEADER_SIZE;

    my ($request_line, @lines) = split /\r?\n/, substr($$buf, 0, $head_len);
    my ($method, $path, $version) =
        $request_line =~ m{^([A-Z]+)\s+(\S+)(?:\s+HTTP/(\d+\.\d+))?\s*$}
        or die "malformed request line\n";
    $version //= '0.9';

    my %headers;
    for my $line (@lines) {
        my ($name, $value) = $line =~ /^([^:\s]+)\s*:\s*(.*?)\s*$/
            or die "malformed header line\n";
        $name = lc $name;
        $headers{$name} = exists $headers{$name} ? "$headers{$name}, $value" : $value;
    }

    my ($consumed, $body);
    if (($headers{'transfer-encoding'} // '') =~ /chunked/i) {
        ($consumed, $body) = parse_chunked($buf, $head_len) or return;
    }
    elsif (defined $headers{'content-length'}) {
        $headers{'content-length'} =~ /^\d+$/ or die "bad content-length\n";
        $consumed = $head_len + $headers{'content-length'};
        return if length $$buf < $consumed;
        $body = substr($$buf, $head_len, $headers{'content-length'});
    }
    else {
        ($consumed, $body) = ($head_len, '');
    }
    substr($$buf, 0, $consumed, '');

    my $connection = lc($headers{connection} // '');
    my $keepalive  = $version eq '1.1'
        ? $connection !~ /\bclose\b/
        : $connection =~ /\bkeep-alive\b/;

    return {
        method    => $method,
        path      => $path,
        version   => $version,
        headers   => \%headers,
        body      => $body,
        keepalive => $keepalive ? 1 : 0,
    };
}

# Parses a chunked body starting at $pos.  Returns (end position, body) or
# an empty list if incomplete; dies on malformed input.
sub parse_chunked {
    my ($buf, $pos) = @_;
    my $body = '';

    while (1) {
        my $eol = index($$buf, "\n", $pos);
        return if $eol < 0;
        my $line = substr($$buf, $pos, $eol - $pos);
        my ($hex) = $line =~ /^\s*([0-9a-fA-F]{1,8})\s*(?:;.*)?\r?$/
            or die "bad chunk size\n";
        my $size = hex $hex;
        $pos = $eol + 1;

        if ($size == 0) {
            # Optional trailer fields, then an empty line.
            while (1) {
                my $end = index($$buf, "\n", $pos);
                return if $end < 0;
                my $trailer = substr($$buf, $pos, $end - $pos);
                $pos = $end + 1;
                return ($pos, $body) if $trailer =~ /^\r?$/;
            }
        }

        return if length $$buf < $pos + $size + 1;
        $body .= substr($$buf, $pos, $size);
        $pos += $size;
        if    (substr($$buf, $pos, 1) eq "\n")   { $pos += 1 }
        elsif (length $$buf < $pos + 2)          { return }
        elsif (substr($$buf, $pos, 2) eq "\r\n") { $pos += 2 }
        else                                     { die "bad chunk terminator\n" }
    }
}

# ---------------------------------------------------------------------------
# Request handling

sub handle_request {
    my ($c, $req) = @_;
    my ($path) = split /\?/, $req->{path}, 2;

    if ($path eq '/__stats') {
        my $tagged = join ',', map { "$_:$tags{$_}" } sort keys %tags;
        queue_response($c, 200, sprintf(
            "port=%d inflight=%d max_inflight=%d requests=%d held=%d%s%s\n",
            $PORT, @stats{qw(inflight max_inflight requests)}, scalar @held,
            length $tagged ? " tags=$tagged" : '',
            $DEFAULT_HOST ? '' : " addr=$HOST"), $req);
        return;
    }
    if ($path eq '/__release') {
        my @released = splice @held;
        finish_request($_) for @released;
        queue_response($c, 200, 'released ' . scalar(@released) . "\n", $req);
        return;
    }
    if ($path eq '/__reset') {
        $stats{max_inflight} = $stats{requests} = 0;
        queue_response($c, 200, "ok\n", $req);
        return;
    }

    $stats{requests}++;
    $stats{inflight}++;
    $stats{max_inflight} = $stats{inflight} if $stats{inflight} > $stats{max_inflight};

    my $tag = $req->{headers}{'x-tag'};
    if (defined $tag && $tag =~ /^[\w.-]+$/) {
        $c->{tag} = $tag;
        $tags{$tag}++;
    }

    $c->{state} = 'wait';
    $c->{req}   = $req;

    if (defined $req->{headers}{'x-hold'}) {
        push @held, $c;
        return;
    }

    my $delay = $req->{headers}{'x-delay-ms'};
    $delay = $opt{delay_ms} unless defined $delay && $delay =~ /^\d+$/;
    $c->{delay} = $delay;

    if ($delay > 0) {
        push @timers, [time + $delay / 1000, $c];
    }
    else {
        finish_request($c);
    }
}

sub finish_request {
    my ($c) = @_;
    return if $c->{closed};
    request_ended($c);
    queue_response($c, 200, "$IDENTITY\n", delete $c->{req});
}

sub request_ended {
    my ($c) = @_;
    $stats{inflight}--;
    my $tag = delete $c->{tag} // return;
    delete $tags{$tag} unless --$tags{$tag};
}

sub queue_response {
    my ($c, $status, $body, $req) = @_;
    my %reason = (200 => 'OK', 400 => 'Bad Request');

    my $head = join "\r\n",
        "HTTP/1.1 $status $reason{$status}",
        "X-Backend-Port: $PORT",
        ($DEFAULT_HOST ? () : "X-Backend-Addr: $HOST:$PORT"),
        (defined $c->{delay} ? 'X-Delayed-Ms: ' . delete $c->{delay} : ()),
        'Content-Type: text/plain',
        'Content-Length: ' . length($body),
        'Connection: ' . ($c->{keepalive} ? 'keep-alive' : 'close'),
        '', '';
    $body = '' if $req && $req->{method} eq 'HEAD';

    $c->{state} = 'write';
    $c->{out} .= $head . $body;
    $wsel->add($c->{sock});
    on_writable($c);
}
