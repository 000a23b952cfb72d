#!/usr/bin/env perl

=head1 NAME

fake-store.pl - a store endpoint that misbehaves, for the upstream affinity
test suite

=head1 SYNOPSIS

    perl t/fake-store.pl --port 7001 --mode unsolicited --log conns.log

=head1 DESCRIPTION

Listens on 127.0.0.1:PORT and answers connections as a Redis server would,
until the MODE's misbehaviour, built on core Perl only.  Each connection is
logged as a line of LOG ("connect TIME") when it comes.  Modes:

=over

=item unsolicited

a C<+OK> reply right after the connection is accepted, before any command;

=item greeting

an HTTP error, as a web server on the store's port would send;

=item junk

PING is answered, then every command gets random bytes;

=item resp3

PING is answered, then every command gets a RESP3 map;

=item deep

PING is answered, then every command gets arrays nested a thousand deep;

=item extra

every command gets its reply twice;

=item silent

nothing is ever answered;

=item halfclose

PING is answered, then the connection is shut down for writing while it
is read on;

=item trickle

PING is answered, then the first other command gets an endless reply, a
byte every tenth of a second;

=item flood

PING is answered, then the first other command gets an endless reply, as
fast as the connection takes it;

=item nil

PING is answered, XREAD gets nil at once, as if its block time were over,
and every other command an empty array;

=item noid

PING is answered, XREAD gets an entry whose id is not a stream id, at
once;

=item old

PING is answered, XREAD gets at once the same entry, with the stream's
first id, whatever it asked from;

=item notid

PING is answered, XADD gets a string that is not a stream id.

=back

Each XREAD received is logged too ("xread TIME"), and each connection
closed by the other side ("close TIME").

=cut

use strict;
use warnings;

use Getopt::Long;
use IO::Select;
use IO::Socket::INET;
use Socket qw(SHUT_WR);
use Time::HiRes qw(time);

my ($port, $mode, $log);
GetOptions('port=i' => \$port, 'mode=s' => \$mode, 'log=s' => \$log)
    && $port && $mode && $log
    or die "usage: $0 --port PORT --mode MODE --log FILE\n";

$SIG{PIPE} = 'IGNORE';
$SIG{TERM} = sub { exit 0 };

my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
    LocalPort => $port, Listen => 64, ReuseAddr => 1)
    or die "listen on $port: $!\n";

open my $logfh, '>>', $log or die "$log: $!\n";
$logfh->autoflush(1);

my $select = IO::Select->new($listen);
my (%pinged, %endless, %sockets);

sub reply_to {
    my ($s, $command) = @_;
    my $ok = $command eq 'PING' ? "+PONG\r\n"
           : $command eq 'AUTH' ? "+OK\r\n"
           : $command eq 'XADD' ? "\$15\r\n1700000000000-0\r\n"
           : "*0\r\n";

    printf {$logfh} "xread %.3f\n", time if $command eq 'XREAD';

    if ($mode eq 'extra') {
        return $ok . $ok;
    }
    if ($mode eq 'silent') {
        return '';
    }
    if ($command eq 'PING' || $command eq 'AUTH') {
        $pinged{$s} = 1;
        return $ok;
    }
    if ($mode eq 'junk') {
        return join '', map { chr int rand 256 } 1 .. 512;
    }
    if ($mode eq 'resp3') {
        return "%1\r\n+key\r\n+value\r\n";
    }
    if ($mode eq 'deep') {
        return ("*1\r\n" x 1000) . ":1\r\n";
    }
    if ($mode eq 'trickle' || $mode eq 'flood') {
        $endless{$s} //= 1;
        return '';
    }
    if ($mode eq 'nil') {
        return $command eq 'XREAD' ? "*-1\r\n" : "*0\r\n";
    }
    if ($mode eq 'noid' && $command eq 'XREAD') {
        return "*1\r\n*2\r\n\$6\r\nstream\r\n*1\r\n*2\r\n\$5\r\nnot-1\r\n"
             . "*2\r\n\$1\r\nm\r\n\$1\r\nx\r\n";
    }
    if ($mode eq 'old' && $command eq 'XREAD') {
        return "*1\r\n*2\r\n\$6\r\nstream\r\n*1\r\n*2\r\n\$3\r\n1-1\r\n"
             . "*2\r\n\$1\r\nm\r\n\$1\r\nx\r\n";
    }
    if ($mode eq 'notid' && $command eq 'XADD') {
        return "\$2\r\nOK\r\n";
    }
    return $ok;
}

# What an endless reply sends now: its header once, then a byte every
# tenth of a second (trickle) or as much as the socket takes (flood).
sub endless {
    for my $s (keys %endless) {
        my $c = $sockets{$s} or next;
        if ($endless{$s} == 1) {
            syswrite $c, "\$999999999\r\n";
            $endless{$s} = 2;
        }
        syswrite $c, $mode eq 'flood' ? 'x' x 65536 : 'x';
    }
}

while (1) {
    for my $s ($select->can_read($mode eq 'flood' && %endless ? 0 : 0.1)) {
        if ($s == $listen) {
            my $c = $listen->accept or next;
            printf {$logfh} "connect %.3f\n", time;
            if ($mode eq 'unsolicited') {
                syswrite $c, "+OK\r\n";
            } elsif ($mode eq 'greeting') {
                syswrite $c, "HTTP/1.1 400 Bad Request\r\n"
                           . "Content-Length: 0\r\n\r\n";
            }
            $c->blocking(0);
            $select->add($c);
            $sockets{$c} = $c;
            next;
        }
        my $n = sysread $s, my $data, 65536;
        next if !defined $n && $!{EAGAIN};
        unless ($n) {
            printf {$logfh} "close %.3f\n", time;
            $select->remove($s);
            delete $pinged{$s};
            delete $endless{$s};
            delete $sockets{$s};
            close $s;
            next;
        }
        my $out = '';
        while ($data =~ /\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n/g) {
            $out .= reply_to($s, uc $1);
        }
        syswrite $s, $out if length $out;
        if ($mode eq 'halfclose' && $pinged{$s}) {
            shutdown $s, SHUT_WR;
        }
    }
    endless();
}
