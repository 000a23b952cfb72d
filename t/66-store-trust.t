#!/usr/bin/env perl

# The store is outside the trust boundary.  Two instances share through a
# real redis-server that asks for a password (requirepass), then for an ACL
# user, then speaks only TLS, then TLS with client certificates: with the
# right auth= and tls_* they share, with a wrong password or an untrusted
# certificate they log one clear error per worker and route on their own,
# no request failing.  Then what someone else who can write to the store may
# do, with secret= set: an entry sealed without the secret (forged) steers
# nothing and is counted; an older pin written again (replayed) does not
# move a session back; no session key or response id is readable in the
# stream; a reply that reuses the id of a response another server stores
# does not take its follow-ups.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use AffinityTest;
use AffinityConf qw(proxy_conf servers chat eventually routes);
use AffinityStore qw(store_keys seal digest message decode entries xadd
                     make_certificates);

plan skip_all => 'redis-server not installed'
    unless AffinityTest::redis_server();
plan skip_all => 'openssl not installed' unless qx{openssl version 2>&1} =~ /SSL/;

my $a = AffinityTest->new(workers => 2);
my $b = AffinityTest->new(workers => 1);
my @replicas = $a->start_mock_replicas(4, '--decode-ms-per-token', 0.2);
my $redis = $a->port;
my $stream = "affinity-trust-$$";
my $a_status = $a->port;
my $b_status = $b->port;
my $json = JSON::PP->new;
my %ct = ('Content-Type' => 'application/json');

my $secret = 'the secret these two instances share';

sub file {
    my ($t, $name, $text) = @_;
    my $path = $t->path($name);
    open my $fh, '>', $path or die "$path: $!";
    print {$fh} $text;
    close $fh;
    chmod 0600, $path;
    return $path;
}

my %secret;
$secret{a} = file($a, 'store.secret', "$secret\n");
$secret{b} = file($b, 'store.secret', "$secret\n");
my $certs = make_certificates($a->path('.'));

# A sees only the last replica: whatever it places, it places there, and B,
# which sees them all, would place most elsewhere on its own.
my $only = $replicas[3];
my %down = map { $_ => 'down' } @replicas[0 .. 2];

sub configure {
    my ($t, $store, %opt) = @_;
    my $status = $t == $a ? $a_status : $b_status;
    my $servers = $t == $a ? servers(\@replicas, %down) : servers(\@replicas);
    $t->write_conf(proxy_conf($t, $servers
        . "        session_affinity header=X-Session-ID zone=s:1m;\n"
        . "        response_affinity zone=r:1m;\n"
        . "        affinity_store $store stream=$stream $opt{params};\n",
        http => "    server {\n        listen 127.0.0.1:$status;\n"
              . "        location / { affinity_status; }\n    }\n"));
}

sub restart {
    my ($t) = @_;
    if ($t->master_pid) { $t->reload_nginx } else { $t->start_nginx }
}

sub replica { $_[0]{headers}{'x-replica-port'} // 'none' }

sub ask {
    my ($t, $session, $text) = @_;
    return $t->http(POST => '/v1/chat/completions',
        headers => { %ct, 'X-Session-ID' => $session },
        body => chat([ user => $text // "Hello from $session" ]));
}

sub status_of {
    my ($t) = @_;
    my $port = $t == $a ? $a_status : $b_status;
    return $json->decode($t->http(GET => '/', port => $port)->{body})
        ->{upstreams}{llm};
}

# A places sessions; B, once it has read them, sends them where A did.
# B is asked once it has applied them: a session B saw first it would place
# itself, and its pin, newer than A's, would win.
sub shared {
    my ($tag) = @_;
    my @sessions = map { "$tag-$_" } 1 .. 6;
    my $since = status_of($b)->{store}{applied};
    return 0 if grep { replica(ask($a, $_)) ne $only } @sessions;
    return 0 unless eventually(sub {
        status_of($b)->{store}{applied} >= $since + 6 }, 8);
    return 6 == grep { replica(ask($b, $_, "again $_")) eq $only } @sessions;
}

sub start_store {
    my (@args) = @_;
    my $server = AffinityTest::redis_server();
    my $conf = file($a, 'redis.conf', join '', map { "$_\n" } @args);
    $a->start_service(redis => $redis, $server, $conf);
}

sub errors_of {
    my ($t, $re) = @_;
    return scalar(() = $t->error_log =~ /$re/g);
}

# ---- AUTH with a password ----------------------------------------------------

start_store("port $redis", 'bind 127.0.0.1', 'save ""', 'requirepass s3cret-pass');

my $plain = "127.0.0.1:$redis";
configure($a, $plain, params => 'auth=' . file($a, 'auth', "s3cret-pass\n")
                                . " secret=$secret{a}");
configure($b, $plain, params => 'auth=' . file($b, 'auth', "default s3cret-pass\n")
                                . " secret=$secret{b}");
restart($_) for $a, $b;
ok shared('password'), 'with the password (and the user "default"), they share';

# A wrong password: one clear error per worker, requests served.
configure($b, $plain, params => 'auth=' . file($b, 'auth', "wrong-pass\n")
                                . " secret=$secret{b}");
restart($b);
is scalar(grep { $_->{status} == 200 } map { ask($b, "wrong-$_") } 1 .. 10), 10,
    'a wrong password fails no request';
ok eventually(sub {
        errors_of($b, qr/unavailable for \w+ \(authentication failed: "WRONGPASS/) >= 1
    }, 5), 'it is logged as a failed authentication, with the store\'s words';
sleep 3;        # the worker tries again: an error said again would show
cmp_ok errors_of($b, qr/authentication failed/), '<=', 1,
    'once for the worker, whatever its tries';
unlike $b->error_log, qr/wrong-pass/, 'the password itself is never logged';

# ---- an ACL user -------------------------------------------------------------

$a->stop_service('redis');
start_store("port $redis", 'bind 127.0.0.1', 'save ""', 'user default off',
            'user nginx on >n9inx-pass ~* &* +@all');
configure($a, $plain, params => 'auth=' . file($a, 'auth', "nginx n9inx-pass\n")
                                . " secret=$secret{a}");
configure($b, $plain, params => 'auth=' . file($b, 'auth', "nginx n9inx-pass\n")
                                . " secret=$secret{b}");
restart($_) for $a, $b;
ok shared('acl'), 'as the ACL user nginx, they share';

# ---- TLS ---------------------------------------------------------------------

$a->stop_service('redis');
my @tls = ("port 0", "tls-port $redis", 'bind 127.0.0.1', 'save ""',
           "tls-cert-file $certs->{server_cert}",
           "tls-key-file $certs->{server_key}",
           "tls-ca-cert-file $certs->{ca}");
start_store(@tls, 'tls-auth-clients no');

configure($a, "localhost:$redis", params => "tls tls_ca=$certs->{ca} secret=$secret{a}");
configure($b, $plain, params => "tls tls_ca=$certs->{ca} secret=$secret{b}");
restart($_) for $a, $b;
ok shared('tls'), 'over TLS, the certificate checked by name and by address, they share';

# Untrusted, or for another name: refused, said once, requests served.
configure($b, $plain, params => "tls tls_ca=$certs->{other_ca} secret=$secret{b}");
restart($b);
is scalar(grep { $_->{status} == 200 } map { ask($b, "untrusted-$_") } 1 .. 5), 5,
    'an untrusted certificate fails no request';
ok eventually(sub { errors_of($b, qr/certificate is not trusted: "/) == 1 }, 5),
    'it is logged once, with the reason';

configure($b, $plain, params => "tls tls_ca=$certs->{ca} tls_name=store.example "
                                . "secret=$secret{b}");
restart($b);
ok eventually(sub { errors_of($b, qr/certificate does not match its tls_name/) == 1 }, 5),
    'a certificate for another name is refused';

# A store that asks for a client certificate: without one, B is refused.
$a->stop_service('redis');
start_store(@tls, 'tls-auth-clients yes');
configure($b, $plain, params => "tls tls_ca=$certs->{ca} secret=$secret{b}");
restart($b);
my $lost = errors_of($b, qr/store of upstream "llm" unavailable/);
ok eventually(sub { errors_of($b, qr/store of upstream "llm" unavailable/) > $lost
                    || $b->error_log =~ /unavailable.*(TLS|closed|read failed)/ }, 5),
    'without a client certificate, the store refuses B';
configure($a, "localhost:$redis",
          params => "tls tls_ca=$certs->{ca} tls_cert=$certs->{client_cert} "
                    . "tls_key=$certs->{client_key} secret=$secret{a}");
configure($b, $plain,
          params => "tls tls_ca=$certs->{ca} tls_cert=$certs->{client_cert} "
                    . "tls_key=$certs->{client_key} secret=$secret{b}");
restart($_) for $a, $b;
ok shared('mtls'), 'with a client certificate, they share';

# ---- what someone else with access to the store may do -----------------------

$a->stop_service('redis');
$a->start_redis($redis);
configure($a, $plain, params => "secret=$secret{a}");
configure($b, $plain, params => "secret=$secret{b}");
restart($_) for $a, $b;
ok shared('plain'), 'without TLS and AUTH, they share';

my $keys = store_keys($secret);
my @pins = grep { $_->{kind} eq 'pin' }
           map { decode($_->[1]{m} // '') } entries($redis, $stream);
ok scalar(@pins), 'the stream holds pins';
my $peer = $pins[0]{peer};        # the id of the replica A sends all to

# Forged: a pin to that replica, of the right form, sealed without the
# secret.  B does not follow it: the session is new to B.
my $forged_before = status_of($b)->{store}{forged};
my $wrong = store_keys('a secret the instances do not share');
for my $i (1 .. 5) {
    my $m = message(pin => int(time * 1000), "\x01" x 8, $peer,
                    digest($keys, pin => "forged-$i"));
    like xadd($redis, $stream, m => seal($wrong, $stream, $m)), qr/^\d+-\d+$/,
        "forged pin $i written";
}
ok eventually(sub { status_of($b)->{store}{forged} >= $forged_before + 5 }, 5),
    'B counts the forged entries';
ask($b, "forged-$_") for 1 .. 5;
is_deeply [ map { $_->{route} } (routes($b))[-5 .. -1] ], [ ('session_new') x 5 ],
    'and follows none of them';

# Replayed: a session A pinned, moved since by B, and A's old pin written
# again, sealed as it was: B refuses it as a message its writer sent
# before, and keeps the newer pin.
{
    my $applied = status_of($b)->{store}{applied};
    is replica(ask($a, 'replayed')), $only, 'A pins a session';
    my $mine = digest($keys, pin => 'replayed');
    my $old;
    ok eventually(sub {
            ($old) = grep { $_->[1]{m} && decode($_->[1]{m})->{body} eq $mine }
                     entries($redis, $stream);
            return $old;
        }, 5), 'A\'s pin is in the stream';
    ok eventually(sub { status_of($b)->{store}{applied} > $applied }, 10),
        'B reads it';
    is replica(ask($b, 'replayed', 'B turn 1')), $only, 'B follows it';

    # B loses the replica: the session moves there, and B's pin is newer.
    my %b_down = ($only => 'down');
    $b->write_conf(proxy_conf($b, servers(\@replicas, %b_down)
        . "        session_affinity header=X-Session-ID zone=s:1m;\n"
        . "        response_affinity zone=r:1m;\n"
        . "        affinity_store $plain stream=$stream secret=$secret{b};\n",
        http => "    server {\n        listen 127.0.0.1:$b_status;\n"
              . "        location / { affinity_status; }\n    }\n"));
    $b->reload_nginx;
    my $moved = replica(ask($b, 'replayed', 'B turn 2'));
    isnt $moved, $only, 'B moves it';
    configure($b, $plain, params => "secret=$secret{b}");
    $b->reload_nginx;

    # the reload read the stream again: once that is done, the replay
    my $read = -1;
    ok eventually(sub {
            my $now = status_of($b)->{store}{read};
            return 1 if $now == $read;
            $read = $now;
            sleep 0.3;
            return 0;
        }, 5), 'B has read the stream again after its reload';
    my $replayed = status_of($b)->{store}{replayed};
    like xadd($redis, $stream, m => $old->[1]{m}), qr/^\d+-\d+$/,
        'A\'s old pin is written again';
    ok eventually(sub { status_of($b)->{store}{replayed} > $replayed }, 5),
        'B reads it, and counts it replayed';
    is replica(ask($b, 'replayed', 'B turn 3')), $moved,
        'the session stays where it moved';
}

# ---- nothing readable in the stream --------------------------------------------

my $response_id;
{
    my $res = $a->http(POST => '/v1/responses', headers => \%ct,
        body => $json->encode({ model => 'm', input => 'remember this',
                                max_output_tokens => 4,
                                request_id => "resp_chosen-by-client-$$" }));
    is $res->{status}, 200, 'a response with an id the client chose';
    $response_id = $json->decode($res->{body})->{id};
    is $response_id, "resp_chosen-by-client-$$", '... has that id';
    ok eventually(sub {
            my $r = $b->http(POST => '/v1/responses', headers => \%ct,
                body => $json->encode({ model => 'm', input => 'next',
                                        previous_response_id => $response_id,
                                        max_output_tokens => 4 }));
            $r->{status} == 200 && replica($r) eq $only;
        }, 5), 'B sends its follow-up where A stored it';
}

my $raw = join '', map { join '', %{ $_->[1] } } entries($redis, $stream);
for my $id ('password-1', 'plain-3', 'replayed', $response_id) {
    is index($raw, $id), -1, "\"$id\" is not in the stream";
}
unlike $raw, qr/127\.0\.0\.1/, 'nor any server\'s address';

# ---- a response id taken over ----------------------------------------------------

# A sees another replica only, and a client reuses the stored response's
# id: the reply comes from that replica, and A keeps the first owner.
{
    my %moved_down = map { $_ => 'down' } @replicas[0, 1, 3];
    $a->write_conf(proxy_conf($a, servers(\@replicas, %moved_down)
        . "        session_affinity header=X-Session-ID zone=s:1m;\n"
        . "        response_affinity zone=r:1m;\n"
        . "        affinity_store $plain stream=$stream secret=$secret{a};\n",
        http => "    server {\n        listen 127.0.0.1:$a_status;\n"
              . "        location / { affinity_status; }\n    }\n"));
    $a->reload_nginx;
    my $res = $a->http(POST => '/v1/responses', headers => \%ct,
        body => $json->encode({ model => 'm', input => 'take it over',
                                max_output_tokens => 4,
                                request_id => $response_id }));
    is replica($res), $replicas[2], 'another replica answers with the same id';
    ok eventually(sub { status_of($a)->{zones}{responses}{conflicts} == 1 }, 3),
        'A refuses it, and counts the conflict';
    like $a->error_log, qr/reused the id of a response another server stores/,
        'and says so';
    my $r = $b->http(POST => '/v1/responses', headers => \%ct,
        body => $json->encode({ model => 'm', input => 'still mine',
                                previous_response_id => $response_id,
                                max_output_tokens => 4 }));
    is replica($r), $only, 'the follow-ups still reach the first owner';
    is((routes($b))[-1]{route}, 'response_hit', '... as response_hit');
}

is_deeply [ $a->log_problems ], [], 'A: no alerts, crashes or sanitizer reports';
# nginx logs at crit the TLS alert of a store that wants a client
# certificate B did not have, once per outage (see above).
is_deeply [ grep { !/\[crit\].*SSL_read\(\) failed.*certificate required/ }
            $b->log_problems ], [],
    'B: no alerts, crashes or sanitizer reports';

done_testing;
