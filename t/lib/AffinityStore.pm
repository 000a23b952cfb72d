package AffinityStore;

# The store's side of the e2e tests: what the instances write to the stream
# (src/core/store_message.h gives the layout), read and written back as
# someone with access to the store would, and certificates for TLS.  Core
# Perl only (Digest::SHA), and the openssl command for certificates.

use strict;
use warnings;

use Carp qw(croak);
use Digest::SHA qw(hmac_sha256);
use Exporter 'import';
use IO::Select;

use AffinityTest;

our @EXPORT_OK = qw(store_keys seal digest message decode entries xadd
                    redis_reply make_certificates);

my %KIND = (pin => 1, response => 2, levels => 3, sent => 4, filled => 5,
            done => 6);

# store_keys($secret) - { entries, ids }: the keys an instance derives from
# the secret of secret=FILE (the file's text without its trailing line
# breaks).
sub store_keys {
    my ($secret) = @_;
    return { entries => hmac_sha256('nginx affinity store: entries', $secret),
             ids => hmac_sha256('nginx affinity store: ids', $secret) };
}

# seal($keys, $stream, $message) - the message with its authenticator.
sub seal {
    my ($keys, $stream, $message) = @_;
    my $mac = hmac_sha256(pack('v', length $stream) . $stream . $message,
                          $keys->{entries});
    return $message . substr($mac, 0, 16);
}

# digest($keys, $kind, $id) - a session key's or response id's digest.
sub digest {
    my ($keys, $kind, $id) = @_;
    return substr(hmac_sha256(chr($KIND{$kind}) . $id, $keys->{ids}), 0, 16);
}

# message($kind, $ms, $instance, $peer, $body, $sender = 1, $seq = $ms) -
# a message before its authenticator; $instance and $peer as 8 bytes.
sub message {
    my ($kind, $ms, $instance, $peer, $body, $sender, $seq) = @_;
    return pack('CCvVQ<', 3, $KIND{$kind}, length $body, $sender // 1, $ms)
        . $instance . $peer . pack('Q<', $seq // $ms) . $body;
}

# decode($m) - { kind, ms, instance, peer, sender, seq, body } of a
# message's bytes.
sub decode {
    my ($m) = @_;
    my ($version, $kind, $len, $sender, $ms) = unpack 'CCvVQ<', $m;
    my %name = reverse %KIND;
    return { version => $version, kind => $name{$kind} // $kind, ms => $ms,
             instance => substr($m, 16, 8), peer => substr($m, 24, 8),
             sender => $sender, seq => unpack('Q<', substr($m, 32, 8)),
             body => substr($m, 40, $len) };
}

# redis_reply($socket) - one RESP2 reply read from a socket, as Perl data:
# strings, numbers, undef for nil, array references; errors as "-TEXT".
sub redis_reply {
    my ($s) = @_;
    my $line = <$s>;
    croak 'no reply from the store' unless defined $line;
    $line =~ s/\r\n\z//;
    my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
    return $rest if $type eq '+';
    return "-$rest" if $type eq '-';
    return $rest + 0 if $type eq ':';
    if ($type eq '$') {
        return undef if $rest < 0;
        my $data = '';
        while (length $data < $rest + 2) {
            my $n = read $s, $data, $rest + 2 - length $data, length $data;
            croak 'short reply from the store' unless $n;
        }
        return substr $data, 0, $rest;
    }
    if ($type eq '*') {
        return undef if $rest < 0;
        return [ map { redis_reply($s) } 1 .. $rest ];
    }
    croak "not a reply: $line";
}

# entries($port, $stream) - [ id, { field => value } ] of every entry of
# the stream, oldest first.
sub entries {
    my ($port, $stream) = @_;
    my $s = AffinityTest::redis_send($port, 'XRANGE', $stream, '-', '+');
    my $reply = redis_reply($s);
    close $s;
    return map { [ $_->[0], { @{ $_->[1] } } ] } @{ $reply // [] };
}

# xadd($port, $stream, @fields) - appends an entry: its id, or the error.
sub xadd {
    my ($port, $stream, @fields) = @_;
    my $s = AffinityTest::redis_send($port, 'XADD', $stream, '*', @fields);
    my $reply = redis_reply($s);
    close $s;
    return $reply;
}

# make_certificates($dir) - a CA and, signed by it, a server certificate
# for localhost and 127.0.0.1 and a client certificate, in $dir: their
# paths as { ca, server_cert, server_key, client_cert, client_key }; and
# another CA that signed none of them (other_ca).
sub make_certificates {
    my ($dir) = @_;
    my %f = map { $_ => "$dir/$_.pem" }
        qw(ca ca_key server_cert server_key client_cert client_key
           other_ca other_ca_key);
    my $run = sub {
        my $out = qx{@_ 2>&1};
        croak "@_: $out" if $?;
    };
    for my $ca (qw(ca other_ca)) {
        $run->("openssl req -x509 -newkey rsa:2048 -nodes -days 2"
               . " -subj '/CN=affinity test $ca' -keyout $f{\"${ca}_key\"}"
               . " -out $f{$ca}");
    }
    open my $ext, '>', "$dir/server.ext" or croak $!;
    print {$ext} "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
    close $ext;
    for my $who (qw(server client)) {
        $run->("openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost'"
               . " -keyout $f{\"${who}_key\"} -out $dir/$who.csr");
        $run->("openssl x509 -req -days 2 -in $dir/$who.csr -CA $f{ca}"
               . " -CAkey $f{ca_key} -CAcreateserial -out $f{\"${who}_cert\"}"
               . ($who eq 'server' ? " -extfile $dir/server.ext" : ''));
    }
    return \%f;
}

1;
