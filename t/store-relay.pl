#!/usr/bin/env perl

=head1 NAME

store-relay.pl - a TCP relay to a Redis server that can hold its answers to
readers, for the upstream affinity test suite

=head1 SYNOPSIS

    perl t/store-relay.pl --port 7001 --to 6379

=head1 DESCRIPTION

Listens on 127.0.0.1:PORT and relays every connection to the Redis server at
127.0.0.1:TO, both ways, built on core Perl only.  A connection that has sent
an XREAD command is a reader.  On SIGUSR1 the relay holds what the server
sends readers; on SIGUSR2 it passes on what it held and holds no more.  The
other connections (the writers) are never held, so a test can have the store
take and answer a message that no reader sees yet, as a loaded host's
readers would see it late.

When either end of a connection closes, the relay closes the other.

=cut

use strict;
use warnings;

use Getopt::Long;
use IO::Select;
use IO::Socket::INET;

my ($port, $to);
GetOptions('port=i' => \$port, 'to=i' => \$to)
    && $port && $to or die "usage: $0 --port PORT --to PORT\n";

my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
    LocalPort => $port, Listen => 64, ReuseAddr => 1)
    or die "listen on $port: $!\n";

my $hold = 0;
$SIG{PIPE} = 'IGNORE';      # an end that went is dropped, not fatal
$SIG{USR1} = sub { $hold = 1 };
$SIG{USR2} = sub { $hold = 0 };
$SIG{TERM} = sub { exit 0 };

# each socket: its other end, whether it is a client, and for a client
# whether it is a reader and what the server said that it holds
my %conn;

my $select = IO::Select->new($listen);

sub drop {
    my ($s) = @_;
    for my $end ($s, $conn{$s} ? $conn{$s}{peer} : ()) {
        $select->remove($end);
        delete $conn{$end};
        close $end;
    }
}

# A signal (the hold's) may interrupt a read or a write: it is tried again.
sub write_all {
    my ($s, $data) = @_;
    while (length $data) {
        my $n = syswrite $s, $data;
        unless (defined $n) {
            next if $!{EINTR};
            return 0;
        }
        substr($data, 0, $n) = '';
    }
    return 1;
}

sub read_some {
    my ($s) = @_;
    while (1) {
        my $n = sysread $s, my $data, 65536;
        return $data if $n;
        return undef if defined $n;     # the other end closed
        return undef unless $!{EINTR};
    }
}

while (1) {
    # the held answers go once the hold ends
    unless ($hold) {
        for my $key (keys %conn) {
            my $c = $conn{$key};
            next unless $c->{client} && length $c->{held};
            write_all($c->{sock}, $c->{held});
            $c->{held} = '';
        }
    }

    my @ready = $select->can_read(0.05);
    for my $s (@ready) {
        if ($s == $listen) {
            my $client = $listen->accept or next;
            my $server = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                               PeerPort => $to);
            unless ($server) {
                close $client;
                next;
            }
            $conn{$client} = { sock => $client, peer => $server, client => 1,
                               reader => 0, held => '' };
            $conn{$server} = { sock => $server, peer => $client, client => 0 };
            $select->add($client, $server);
            next;
        }
        my $c = $conn{$s} or next;
        my $data = read_some($s);
        unless (defined $data) {
            drop($s);
            next;
        }
        if ($c->{client}) {
            $c->{reader} = 1 if $data =~ /\bXREAD\b/i;
            drop($s) unless write_all($c->{peer}, $data);
            next;
        }
        my $client = $conn{$c->{peer}} or next;
        if ($client->{reader} && ($hold || length $client->{held})) {
            $client->{held} .= $data;
        } else {
            drop($s) unless write_all($c->{peer}, $data);
        }
    }
}
