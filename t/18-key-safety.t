#!/usr/bin/env perl

# What a session key may carry back to clients and on to replicas: control
# characters never reach a header, a key from a cookie is never copied into
# a response header, quotes and backslashes never into a cookie; Set-Cookie
# attributes are configurable; $affinity_session reaches the replica through
# proxy_set_header, generated ids included.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(servers);

my $t = AffinityTest->new;
my @ports = $t->start_backends(3);
my ($echo, $attrs, $forward, $replica, $by_name) = map { $t->port } 1 .. 5;
my $listen = $t->listen_port;
my $up = servers(\@ports);

$t->write_conf(<<"EOF");
    client_body_buffer_size 1m;

    upstream llm {
$up
        session_affinity header=X-Session-ID cookie=sid field=user generate;
    }

    upstream attrs {
$up
        session_affinity cookie=sid generate cookie_secure cookie_max_age=1h
                         cookie_domain=example.com cookie_samesite=strict
                         cookie_path=/v1;
    }

    # a replica that answers with the session header it received; keepalive
    # wraps the balancer, as in most production upstreams
    upstream replica {
        server 127.0.0.1:$replica;
        session_affinity header=X-Session-ID cookie=sid field=user generate
                         zone=replica_sessions:1m;
        keepalive 8;
    }

    server {
        listen 127.0.0.1:$listen;
        location / { proxy_pass http://llm; }
    }

    server {
        listen 127.0.0.1:$echo;
        location / {
            proxy_pass http://llm;
            add_header X-Aff "[\$affinity_session]" always;
        }
    }

    server {
        listen 127.0.0.1:$attrs;
        location / { proxy_pass http://attrs; }
    }

    server {
        listen 127.0.0.1:$forward;
        location / {
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Session-ID \$affinity_session;
        }
    }

    # proxy_pass with the upstream's name in a variable
    server {
        listen 127.0.0.1:$by_name;
        location / {
            set \$up replica;
            proxy_pass http://\$up;
            proxy_set_header X-Session-ID \$affinity_session;
        }
    }

    server {
        listen 127.0.0.1:$replica;
        location / {
            add_header X-Received "[\$http_x_session_id]" always;
            return 200 "ok\\n";
        }
    }
EOF
$t->start_nginx;

my $json = { 'Content-Type' => 'application/json' };

# Every header line of a response, as "name: value" text.
sub all_headers {
    my ($r) = @_;
    my ($head) = split /\r\n\r\n/, $r->{raw} // '', 2;
    return $head // '';
}

subtest 'control characters in a body field never reach a header' => sub {
    for my $value ('a\r\nSet-Cookie: injected=1', 'a\nX-Injected: 1',
                   'a\u0000b', 'tab\there', 'del\u007f', 'a\rb') {
        my @backends;
        for (1 .. 3) {
            my $r = $t->http(POST => '/', port => $echo, headers => $json,
                             body => qq({"user":"$value","messages":[]}));
            is $r->{status}, 200, "served ($value)";
            is $r->{headers}{'x-aff'}, '[]', '$affinity_session is empty';
            ok !defined $r->{headers}{'x-session-id'}, 'not echoed';
            is_deeply $r->{set_cookie}, [], 'no cookie';
            unlike all_headers($r), qr/injected|X-Injected/i,
                'nothing injected';
            push @backends, $r->{headers}{'x-backend-port'};
        }
        is scalar(grep { $_ ne $backends[0] } @backends), 0,
            'still routed by the key: sticky';
    }

    my $r = $t->http(POST => '/', port => $echo, headers => $json,
                     body => '{"user":"caf\u00e9 au lait; \"x\""}');
    is $r->{headers}{'x-aff'}, qq([caf\xc3\xa9 au lait; "x"]),
        'a key without control characters is shown as it is';
    ok !defined $r->{headers}{'x-session-id'},
        'but not echoed: not a cookie value';
};

subtest 'a key from a cookie is never copied into a response header' => sub {
    my $r = $t->http(GET => '/', headers => { Cookie => 'sid=secret-token-1' });
    is $r->{status}, 200, 'served';
    unlike all_headers($r), qr/secret-token-1/,
        'the cookie value is in no response header';
    is_deeply $r->{set_cookie}, [], 'and the cookie is not set again';

    my $h = $t->http(GET => '/', headers => { 'X-Session-ID' => 'from-hdr' });
    is $h->{headers}{'x-session-id'}, 'from-hdr', 'a header key is echoed';
};

subtest 'quotes and backslashes are never echoed into a cookie' => sub {
    for my $key ('a"b', 'a\\b', '"quoted"', 'x\\"; Secure') {
        my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => $key });
        is $r->{status}, 200, 'served';
        is_deeply $r->{set_cookie}, [], "no cookie for $key";
        ok !defined $r->{headers}{'x-session-id'}, 'no header either';
    }
};

subtest 'Set-Cookie attributes' => sub {
    my $r = $t->http(GET => '/v1/chat', port => $attrs);
    my ($id) = map { /^sid=([^;]+)/ ? $1 : () } @{ $r->{set_cookie} };
    ok $id, 'a generated id in the cookie';
    is_deeply $r->{set_cookie},
        ["sid=$id; Path=/v1; Domain=example.com; Max-Age=3600; HttpOnly; "
         . 'Secure; SameSite=Strict'],
        'with the configured attributes';

    my $again = $t->http(GET => '/v1/chat', port => $attrs,
                         headers => { Cookie => "sid=$id" });
    is_deeply $again->{set_cookie}, $r->{set_cookie},
        'with Max-Age, a key from the cookie is refreshed';
    is $again->{headers}{'x-backend-port'}, $r->{headers}{'x-backend-port'},
        'and sticks';

    my $default = $t->http(GET => '/', headers => { 'X-Session-ID' => 'd1' });
    is_deeply $default->{set_cookie},
        ['sid=d1; Path=/; HttpOnly; SameSite=Lax'], 'the defaults';
};

subtest 'configuration errors' => sub {
    my $t2 = AffinityTest->new;
    for my $case (['cookie_samesite=none', qr/requires "cookie_secure"/],
                  ['cookie_samesite=sometimes', qr/invalid parameter/],
                  ['cookie_domain=exa_mple.com', qr/invalid parameter/],
                  ['cookie_path=v1', qr/invalid parameter/],
                  ['cookie_max_age=forever', qr/invalid parameter/],
                  ['cookie_max_age=0', qr/invalid parameter/]) {
        my ($param, $error) = @$case;
        $t2->write_conf(<<"EOF");
    upstream u {
        server 127.0.0.1:$ports[0];
        session_affinity cookie=sid $param;
    }
EOF
        my ($rc, $out) = $t2->nginx_test;
        isnt $rc, 0, "$param is refused";
        like $out, $error, 'with a reason';
    }

    $t2->write_conf(<<"EOF");
    upstream u {
        server 127.0.0.1:$ports[0];
        session_affinity header=X-Session-ID cookie_secure;
    }
EOF
    my ($rc, $out) = $t2->nginx_test;
    is $rc, 0, 'cookie_* without cookie= is accepted';
    like $out, qr/\[warn\].*no effect without "cookie="/, 'with a warning';
};

subtest '$affinity_session reaches the replica through proxy_set_header' => sub {
    my $r = $t->http(GET => '/', port => $forward);
    my $id = $r->{headers}{'x-session-id'};
    like $id, qr/^[0-9a-f-]{36}$/, 'a generated id echoed to the client';
    is $r->{headers}{'x-received'}, "[$id]", 'and sent to the replica';

    $r = $t->http(GET => '/', port => $forward,
                  headers => { Cookie => 'sid=cookie-key' });
    is $r->{headers}{'x-received'}, '[cookie-key]',
        'a key from a cookie is forwarded';

    $r = $t->http(POST => '/', port => $forward, headers => $json,
                  body => '{"user":"field-key","messages":[]}');
    is $r->{headers}{'x-received'}, '[field-key]',
        'a key from a body field is forwarded';

    $r = $t->http(POST => '/', port => $forward, headers => $json,
                  body => '{"user":"a\r\nX-Evil: 1","messages":[]}');
    is $r->{headers}{'x-received'}, '[]',
        'a key with control characters is not';

    $r = $t->http(GET => '/', port => $by_name);
    $id = $r->{headers}{'x-session-id'};
    like $id, qr/^[0-9a-f-]{36}$/, 'proxy_pass http://$up: an id generated';
    is $r->{headers}{'x-received'}, "[$id]", 'and sent to the replica';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
