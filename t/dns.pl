#!/usr/bin/env perl

=head1 NAME

dns.pl - mock authoritative DNS server for the upstream affinity test suite

=head1 SYNOPSIS

    perl t/dns.pl --port 5353 --records FILE [--ttl 1] [--pidfile FILE] [--watch-pid PID]

=head1 DESCRIPTION

A single-process DNS server over UDP on 127.0.0.1:PORT, built on core Perl
only, so that tests can point nginx's C<resolver> at it and change what a
name resolves to while nginx runs (C<server NAME resolve;> upstream
servers).

The records file has one name a line, followed by its IPv4 addresses:

    # comment
    app.test    127.0.0.2 127.0.0.3
    other.test  127.0.0.4

Names are matched without regard to case or a trailing dot.  A name listed
without addresses exists but has no A records.  Malformed lines are reported
on standard error and skipped.  The file is read again for every query, so a
test changes the answers by replacing the file; it should write a temporary
file and rename it over the old one, so that a query never sees a half-written
file.  While the file does not exist, every query is answered with SERVFAIL.

Answers (every response is authoritative, copies the query's ID and RD bit,
sets RA, and repeats the question):

    A or ANY, listed name    NOERROR, one A record per address, TTL --ttl
    other type, listed name  NOERROR, no records (AAAA included)
    name not listed          NXDOMAIN, no records
    class other than IN/ANY  REFUSED
    opcode other than QUERY  NOTIMP, no question
    not exactly one question,
    or a malformed question  FORMERR, no question

Packets shorter than a DNS header, and responses (QR set), are ignored.  No
authority (SOA) or additional records are ever sent, and answers are not
truncated (nginx reads UDP responses of up to 4096 bytes, about 250
addresses).  There is no TCP listener.

Each query is logged on standard output as one line:

    query ID NAME TYPE -> RCODE ADDRESSES...

Options:

    --port PORT       UDP port to listen on (required)
    --records FILE    the records file (required)
    --ttl SECONDS     TTL of the A records (default 1)
    --pidfile FILE    write the process id to FILE once listening (removed on exit)
    --watch-pid PID   exit when process PID no longer exists

The server exits cleanly on SIGTERM or SIGINT.

=cut

use strict;
use warnings;

use Errno qw(EAGAIN EWOULDBLOCK EINTR EADDRINUSE);
use Getopt::Long qw(GetOptions);
use IO::Handle;
use IO::Select;
use IO::Socket::INET;
use Socket qw(inet_aton);
use Time::HiRes qw(time);

use constant {
    MAX_PACKET => 65535,

    TYPE_A    => 1,
    TYPE_AAAA => 28,
    TYPE_ANY  => 255,
    CLASS_IN  => 1,
    CLASS_ANY => 255,

    NOERROR  => 0,
    FORMERR  => 1,
    SERVFAIL => 2,
    NXDOMAIN => 3,
    NOTIMP   => 4,
    REFUSED  => 5,
};

my %RCODE_NAME = (0 => 'NOERROR', 1 => 'FORMERR', 2 => 'SERVFAIL',
                  3 => 'NXDOMAIN', 4 => 'NOTIMP', 5 => 'REFUSED');
my %TYPE_NAME  = (1 => 'A', 2 => 'NS', 5 => 'CNAME', 6 => 'SOA', 12 => 'PTR',
                  15 => 'MX', 16 => 'TXT', 28 => 'AAAA', 33 => 'SRV', 255 => 'ANY');

my %opt = (ttl => 1);
GetOptions(
    'port=i'      => \$opt{port},
    'records=s'   => \$opt{records},
    'ttl=i'       => \$opt{ttl},
    'pidfile=s'   => \$opt{pidfile},
    'watch-pid=i' => \$opt{watch_pid},
) or die "usage: $0 --port PORT --records FILE [--ttl SECONDS] [--pidfile FILE] "
       . "[--watch-pid PID]\n";
die "$0: --port is required\n" unless $opt{port};
die "$0: --records is required\n" unless defined $opt{records};
die "$0: --ttl must be 0 or more\n" if $opt{ttl} < 0;

STDOUT->autoflush(1);

my $running = 1;
$SIG{TERM} = $SIG{INT} = sub { $running = 0 };

my $sock = listen_socket($opt{port});
my $sel  = IO::Select->new($sock);

if (defined $opt{pidfile}) {
    open my $fh, '>', $opt{pidfile} or die "$0: cannot write $opt{pidfile}: $!\n";
    print {$fh} "$$\n";
    close $fh;
}

while ($running) {
    # Wake up regularly to notice signals and --watch-pid.
    if ($sel->can_read(1)) {
        while (1) {
            my $peer = recv($sock, my $packet, MAX_PACKET, 0);
            if (!defined $peer) {
                last if $! == EAGAIN || $! == EWOULDBLOCK;
                next if $! == EINTR;
                warn "$0: recv: $!\n";
                last;
            }
            my $reply = eval { answer($packet) };
            warn "$0: internal error: $@" if $@;
            send($sock, $reply, 0, $peer) if defined $reply;
        }
    }
    $running = 0 if $opt{watch_pid} && !kill(0, $opt{watch_pid});
}

close $sock;
unlink $opt{pidfile} if defined $opt{pidfile};
exit 0;

# ---------------------------------------------------------------------------

sub listen_socket {
    my ($port) = @_;

    # Retry for a while: the port may briefly still be held after a restart.
    my $deadline = time + 5;
    while (1) {
        my $s = IO::Socket::INET->new(
            LocalAddr => '127.0.0.1',
            LocalPort => $port,
            Proto     => 'udp',
        );
        if ($s) {
            $s->blocking(0);
            return $s;
        }
        die "$0: cannot listen on 127.0.0.1:$port/udp: $!\n"
            unless $! == EADDRINUSE && time < $deadline;
        select(undef, undef, undef, 0.1);
    }
}

# Reads the records file: { lc name without trailing dot => [addresses] },
# or undef if it cannot be read.
sub read_records {
    open my $fh, '<', $opt{records} or return undef;
    my %records;
    while (my $line = <$fh>) {
        $line =~ s/#.*//;
        my ($name, @addrs) = split ' ', $line;
        next unless defined $name;
        my @bad = grep { !valid_ipv4($_) } @addrs;
        if (@bad || !valid_name($name)) {
            warn "$0: $opt{records} line $.: skipped (bad "
                . (@bad ? "address @bad" : "name $name") . ")\n";
            next;
        }
        push @{ $records{ canonical($name) } }, @addrs;
    }
    close $fh;
    return \%records;
}

sub canonical {
    my ($name) = @_;
    $name = lc $name;
    $name =~ s/\.\z// unless $name eq '.';
    return $name;
}

sub valid_ipv4 {
    my ($addr) = @_;
    my @octets = $addr =~ /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/ or return 0;
    return !grep { $_ > 255 } @octets;
}

sub valid_name {
    my ($name) = @_;
    my $c = canonical($name);
    return 0 if $c eq '.' || $c eq '' || length($c) > 253;
    return !grep { !length || length > 63 } split /\./, $c, -1;
}

# Returns the response to one packet, or undef to ignore the packet.
sub answer {
    my ($packet) = @_;
    return undef if length $packet < 12;

    my ($id, $flags, $qdcount) = unpack 'n n n', $packet;
    return undef if $flags & 0x8000;    # a response, not a query

    my $opcode = ($flags >> 11) & 0xf;
    my $rd     = $flags & 0x0100;
    my $reply_flags = sub {
        my ($rcode) = @_;
        # QR, opcode echoed, AA, RD copied, RA, rcode
        return 0x8000 | ($opcode << 11) | 0x0400 | $rd | 0x0080 | $rcode;
    };
    my $bare = sub {
        my ($rcode, $why) = @_;
        print "query $id ($why) -> $RCODE_NAME{$rcode}\n";
        return pack 'n n n n n n', $id, $reply_flags->($rcode), 0, 0, 0, 0;
    };

    return $bare->(NOTIMP, "opcode $opcode") if $opcode != 0;
    return $bare->(FORMERR, "$qdcount questions") if $qdcount != 1;

    my ($labels, $end) = parse_name($packet, 12);
    return $bare->(FORMERR, 'malformed question')
        if !$labels || $end + 4 > length $packet;
    my ($qtype, $qclass) = unpack 'n n', substr($packet, $end, 4);
    my $question = substr($packet, 12, $end + 4 - 12);

    # A label with a dot, blank or unprintable byte never matches a record.
    my $plain = !grep { /[^\x21-\x2d\x2f-\x7e]/ } @$labels;
    my $qname = @$labels ? join('.', @$labels) : '.';
    $qname =~ s/([^\x21-\x7e])/sprintf '\\%03d', ord $1/ge;    # for the log
    my $type_name = $TYPE_NAME{$qtype} // "TYPE$qtype";
    my ($rcode, @addrs);
    if ($qclass != CLASS_IN && $qclass != CLASS_ANY) {
        $rcode = REFUSED;
    }
    elsif (my $records = read_records()) {
        my $addrs = $plain ? $records->{ lc join '.', @$labels } : undef;
        if (!$addrs) {
            $rcode = NXDOMAIN;
        }
        else {
            $rcode = NOERROR;
            @addrs = @$addrs if $qtype == TYPE_A || $qtype == TYPE_ANY;
        }
    }
    else {
        warn "$0: cannot read $opt{records}: $!\n";
        $rcode = SERVFAIL;
    }

    print "query $id $qname $type_name -> $RCODE_NAME{$rcode}",
        (map { " $_" } @addrs), "\n";

    my $reply = pack('n n n n n n', $id, $reply_flags->($rcode), 1, scalar @addrs, 0, 0)
        . $question;
    for my $addr (@addrs) {
        # Name: pointer to the question's name at offset 12.
        $reply .= pack('n n n N n', 0xc00c, TYPE_A, CLASS_IN, $opt{ttl}, 4) . inet_aton($addr);
    }
    return $reply;
}

# Parses an uncompressed name at $pos.  Returns (\@labels, position after
# it), or an empty list if it is malformed, compressed or runs past the end.
sub parse_name {
    my ($packet, $pos) = @_;
    my @labels;
    my $total = 0;
    while (1) {
        return if $pos >= length $packet;
        my $len = ord substr($packet, $pos, 1);
        $pos++;
        last if $len == 0;
        return if $len > 63;    # compression pointer or reserved label type
        return if $pos + $len > length $packet;
        $total += $len + 1;
        return if $total > 255;
        push @labels, substr($packet, $pos, $len);
        $pos += $len;
    }
    return (\@labels, $pos);
}
