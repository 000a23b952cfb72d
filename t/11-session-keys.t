#!/usr/bin/env perl

# session_affinity key sources: header, cookie and JSON body field in the
# order written; generated ids; what is echoed and what is not.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers routes route_lines);

my $t = AffinityTest->new;
my @ports = $t->start_backends(3);
my ($field_first, $unbuffered, $gen_prompt) = ($t->port, $t->port, $t->port);
my $gen_log = $t->path('logs/generated.log');
my $up = servers(\@ports);

$t->write_conf(proxy_conf($t, $up . <<"EOF", http => <<"HTTP"));
        session_affinity header=X-Session-ID cookie=llm_session
                         field=user field=metadata.session_id generate;
EOF
    upstream field_first {
$up
        session_affinity field=prompt_cache_key header=X-Conversation;
    }

    upstream gen_prompt {
$up
        session_affinity generate;
        prefix_affinity;
    }

    server {
        listen 127.0.0.1:$gen_prompt;
        access_log "$gen_log" route;
        location / { proxy_pass http://gen_prompt; }
    }

    server {
        listen 127.0.0.1:$field_first;
        client_body_buffer_size 1k;
        location / { proxy_pass http://field_first; }
        location /unbuffered {
            proxy_request_buffering off;
            proxy_pass http://field_first;
        }
    }
HTTP
$t->start_nginx;

my $json = { 'Content-Type' => 'application/json' };
my $uuid = qr/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

# The key echoed back: upstream llm echoes in X-Session-ID, upstream
# field_first in its first header=, X-Conversation.
sub key_used {
    my ($res, $header) = @_;
    return $res->{headers}{ $header // 'x-session-id' };
}

subtest 'sources in the order written' => sub {
    my $body = '{"model":"m","user":"from-field","messages":[]}';

    is key_used($t->http(POST => '/', headers => {
        %$json, 'X-Session-ID' => 'from-header',
        Cookie => 'a=b; llm_session=from-cookie' }, body => $body)),
        'from-header', 'header wins over cookie and field';

    my $c = $t->http(POST => '/', headers => {
        %$json, Cookie => 'a=b; llm_session=from-cookie' }, body => $body);
    is +(routes($t))[-1]{session}, 'from-cookie', 'cookie wins over field';
    ok !defined key_used($c), 'a key from the cookie is not put in a header';

    is key_used($t->http(POST => '/', headers => $json, body => $body)),
        'from-field', 'field when there is no header or cookie';

    is key_used($t->http(POST => '/', headers => $json,
        body => '{"metadata":{"session_id":"nested-1"},"user":""}')),
        'nested-1', 'dotted field; an empty string counts as absent';

    is key_used($t->http(POST => '/', headers => $json,
        body => '{"user":42}')), '42', 'a number is used';

    is key_used($t->http(POST => '/', headers => $json,
        body => '{"user":4.2e1}')), '42', 'in its shortest form';

    is key_used($t->http(POST => '/', headers => $json,
        body => '{"user":"caf\u00e9-\u0031"}')), undef,
        'a non-ASCII key is used but not echoed';

    my $r = $t->http(POST => '/', port => $field_first, headers => {
        %$json, 'X-Conversation' => 'hdr' },
        body => '{"prompt_cache_key":"pck-7"}');
    is $r->{status}, 200, 'served';
    is key_used($r, 'x-conversation'), 'pck-7', 'field written first wins over the header';
};

subtest 'the same key routes alike from any source' => sub {
    my %seen;
    for my $i (1 .. 20) {
        my $key = "same-$i";
        my @b = map { $_->{headers}{'x-backend-port'} } (
            $t->http(GET => '/', headers => { 'X-Session-ID' => $key }),
            $t->http(GET => '/', headers => { Cookie => "llm_session=$key" }),
            $t->http(POST => '/', headers => $json,
                     body => qq({"user":"$key"})),
        );
        $seen{$i} = (grep { $_ ne $b[0] } @b) ? 'split' : 'one';
    }
    is scalar(grep { $_ eq 'split' } values %seen), 0,
        'header, cookie and field with one key reach one backend';
};

subtest 'generate' => sub {
    my $r = $t->http(GET => '/');
    is $r->{status}, 200, 'served';
    my $id = key_used($r);
    like $id, $uuid, 'X-Session-ID is a UUID v4';
    is_deeply $r->{set_cookie}, ["llm_session=$id; Path=/; HttpOnly; SameSite=Lax"],
        'Set-Cookie carries it';

    my $b = $r->{headers}{'x-backend-port'};
    for (1 .. 5) {
        my $again = $t->http(GET => '/', headers => { Cookie => "llm_session=$id" });
        is $again->{headers}{'x-backend-port'}, $b, 'the cookie sticks';
        is_deeply $again->{set_cookie}, [], 'a cookie the client has is not set again';
        ok !defined key_used($again),
            'a key from the cookie is not copied into the header';
    }

    my $hdr = $t->http(GET => '/', headers => { 'X-Session-ID' => 'client-id' });
    is key_used($hdr), 'client-id', 'a key the client sent is echoed';
    is_deeply $hdr->{set_cookie},
        ['llm_session=client-id; Path=/; HttpOnly; SameSite=Lax'],
        'and set as the cookie';

    my %ids = map { key_used($t->http(GET => '/')) => 1 } 1 .. 50;
    is scalar(keys %ids), 50, 'generated ids are distinct';

    my @r = grep { $_->{session} =~ $uuid } routes($t);
    ok @r >= 50, '$affinity_session logs generated ids';
};

subtest 'a generated id is reported by what placed it' => sub {
    # A generated id has no history: its first request is placed by its
    # prompt, and $affinity_route says how (prefix_new, then prefix_hit
    # for the same prompt), not session_new; the id is pinned all the
    # same, and a client's own new key is still session_new.
    my $prompt = 'You are a careful assistant. ' x 20;
    my $body = qq({"model":"m","messages":[{"role":"system",)
             . qq("content":"$prompt"},{"role":"user","content":"q"}]});
    my (@ids, @ports);
    for (1 .. 4) {
        my $r = $t->http(POST => '/', port => $gen_prompt,
                         headers => $json, body => $body);
        is $r->{status}, 200, 'served';
        push @ids, key_used($r);
        push @ports, $r->{headers}{'x-backend-port'};
    }
    like $_, $uuid, 'a generated id' for @ids;
    is scalar(keys %{{ map { $_ => 1 } @ports }}), 1,
        'one prompt, one backend, whatever the ids';

    my @r = map { $_->{route} } route_lines($gen_log);
    is_deeply \@r, [qw(prefix_new prefix_hit prefix_hit prefix_hit)],
        'routes: prefix_new, then prefix_hit';

    my $again = $t->http(POST => '/', port => $gen_prompt,
        headers => { %$json, 'X-Session-ID' => $ids[0] },
        body => '{"model":"m","messages":[{"role":"user","content":"other"}]}');
    is $again->{headers}{'x-backend-port'}, $ports[0],
        'the generated id was pinned: a later turn with another prompt stays';
    is +(route_lines($gen_log))[-1]{route}, 'session_hit',
        'as a session_hit';

    $t->http(POST => '/', port => $gen_prompt,
        headers => { %$json, 'X-Session-ID' => 'client-own' }, body => $body);
    is +(route_lines($gen_log))[-1]{route}, 'session_new',
        'a new key the client sent is session_new';
};

subtest 'invalid keys are routed but never echoed' => sub {
    for my $bad ('has space', 'semi;colon', 'com,ma', 'x' x 257) {
        my @b;
        for (1 .. 3) {
            my $r = $t->http(GET => '/', headers => { 'X-Session-ID' => $bad });
            is $r->{status}, 200, 'served';
            ok !defined key_used($r), 'not echoed';
            is_deeply $r->{set_cookie}, [], 'no cookie';
            push @b, $r->{headers}{'x-backend-port'};
        }
        is scalar(grep { $_ ne $b[0] } @b), 0, 'still sticky';
    }

    my $ok = $t->http(GET => '/', headers => { 'X-Session-ID' => 'y' x 256 });
    is key_used($ok), 'y' x 256, 'a 256-byte key is echoed';
};

subtest 'bodies in temporary files and unbuffered bodies' => sub {
    my $pad = 'a' x (200 * 1024);
    my $big = qq({"messages":[{"role":"user","content":"$pad"}],"prompt_cache_key":"big-1"});
    my $r = $t->http(POST => '/', port => $field_first, headers => $json,
                     body => $big);
    is $r->{status}, 200, 'a 200 KB body (in a temp file) is served';
    is key_used($r, 'x-conversation'), 'big-1', 'its field is found';

    # nginx reads a small body with the headers and then treats it as
    # buffered; a large one is still arriving when the balancer runs.
    my $stream = qq({"messages":[{"role":"user","content":"$pad"}],"prompt_cache_key":"nb"});
    $r = $t->http(POST => '/unbuffered', port => $field_first,
                  headers => $json, body => $stream);
    is $r->{status}, 200, 'an unbuffered body is served';
    ok !defined key_used($r, 'x-conversation'), 'without a key';

    $r = $t->http(POST => '/unbuffered', port => $field_first,
                  headers => $json, body => '{"prompt_cache_key":"small"}');
    is key_used($r, 'x-conversation'), 'small',
        'a body read whole with the headers is used';

    for my $body ('{"prompt_cache_key": "tru', 'not json at all', '[1,2]', '') {
        $r = $t->http(POST => '/', port => $field_first, headers => $json,
                      body => $body);
        is $r->{status}, 200, "bad body '" . substr($body, 0, 12) . "' served";
    }

    $r = $t->http(POST => '/', port => $field_first,
                  headers => { 'Content-Type' => 'text/plain' },
                  body => '{"prompt_cache_key":"plain"}');
    ok !defined key_used($r, 'x-conversation'),
        'a text/plain body is not parsed';

    my $log = $t->error_log;
    my @warn = $log =~ /(not buffered)/g;
    is scalar(@warn), 1, 'unbuffered body warned about once';
    $t->http(POST => '/unbuffered', port => $field_first, headers => $json,
             body => $stream) for 1 .. 8;
    @warn = $t->error_log =~ /(not buffered)/g;
    ok @warn <= 4, 'not once per request (at most once per worker)';
};

$t->stop_nginx;
is_deeply [ $t->log_problems ], [], 'no alert, crit, emerg or crash in error.log';

done_testing;
