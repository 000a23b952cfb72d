#!/usr/bin/env perl

# Directive validation: "nginx -t" fails on bad parameters with a message
# that names the parameter, and accepts the documented forms.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;

use AffinityTest;
use AffinityConf qw(proxy_conf servers);

my $t = AffinityTest->new;
my $up = servers([ $t->port, $t->port ]);

sub nginx_t {
    my ($upstream) = @_;
    $t->write_conf(proxy_conf($t, $up . $upstream));
    return $t->nginx_test;
}

my @bad = (
    [ 'session_affinity foo=bar;',           qr/invalid parameter "foo=bar"/ ],
    [ 'session_affinity generate=1;',        qr/invalid parameter "generate=1"/ ],
    [ 'session_affinity timeout=soon;',      qr/invalid timeout "timeout=soon"/ ],
    [ 'session_affinity timeout=0;',         qr/invalid timeout "timeout=0"/ ],
    [ 'session_affinity zone=nosize;',       qr/invalid zone "nosize"/ ],
    [ 'session_affinity zone=z:lots;',       qr/invalid zone size "z:lots"/ ],
    [ 'session_affinity zone=z:16k;',        qr/zone "z:16k" is too small/ ],
    [ 'session_affinity header=;',           qr/invalid key source "header="/ ],
    [ 'session_affinity header=X:Y;',        qr/invalid key source "header=X:Y"/ ],
    [ 'session_affinity "cookie=a;b";',      qr/invalid key source "cookie=a;b"/ ],
    [ 'session_affinity field=a..b;',        qr/invalid key source "field=a..b"/ ],
    [ 'session_affinity field=.a;',          qr/invalid key source "field=.a"/ ],
    [ "session_affinity;\n session_affinity;", qr/"session_affinity" directive is duplicate/ ],
    [ "session_affinity;\n affinity_balance factor=0.5;", qr/invalid factor "factor=0.5"/ ],
    [ "session_affinity;\n affinity_balance factor=x;",   qr/invalid factor "factor=x"/ ],
    [ "session_affinity;\n affinity_balance slack=-1;",   qr/invalid slack "slack=-1"/ ],
    [ "session_affinity;\n affinity_balance spread=2;",   qr/invalid parameter "spread=2"/ ],
    [ 'affinity_balance factor=1.5;',        qr/"affinity_balance" in upstream "llm" requires "session_affinity"/ ],
    # A parameter that takes one value is refused twice, as nginx does.
    [ 'session_affinity timeout=1m timeout=2m;', qr/duplicate parameter "timeout=2m"/ ],
    [ 'session_affinity generate generate;',  qr/duplicate parameter "generate"/ ],
    [ 'session_affinity zone=a:1m zone=b:1m;', qr/duplicate parameter "zone=b:1m"/ ],
    [ 'session_affinity cookie=c cookie_secure cookie_secure;', qr/duplicate parameter "cookie_secure"/ ],
    [ 'session_affinity cookie=c cookie_path=/a cookie_path=/b;', qr/duplicate parameter "cookie_path=\/b"/ ],
    [ "session_affinity;\n affinity_balance factor=2 factor=3;", qr/duplicate parameter "factor=3"/ ],
    [ "session_affinity;\n affinity_balance slack=1 slack=1;",   qr/duplicate parameter "slack=1"/ ],
    [ 'prefix_affinity lengths=100 lengths=200;', qr/duplicate parameter "lengths=200"/ ],
    [ 'prefix_affinity step=1k step=2k;',     qr/duplicate parameter "step=2k"/ ],
    [ 'prefix_affinity max=8k max=8k;',       qr/duplicate parameter "max=8k"/ ],
    [ 'prefix_affinity growth=10 growth=20;', qr/duplicate parameter "growth=20"/ ],
    [ 'prefix_affinity timeout=1m timeout=1m;', qr/duplicate parameter "timeout=1m"/ ],
    [ 'prefix_affinity step=x;',              qr/invalid step size "step=x"/ ],
    [ 'prefix_affinity max=0;',               qr/max "max=0" is too small, the minimum is 1/ ],
    [ 'prefix_affinity cache=0;',             qr/cache "cache=0" is too small, the minimum is 1/ ],
    [ 'prefix_affinity cache=lots;',          qr/invalid cache size "cache=lots"/ ],
    [ 'prefix_affinity cache=1m cache=2m;',   qr/duplicate parameter "cache=2m"/ ],
    [ 'prefix_affinity cache=off cache=2m;',  qr/duplicate parameter "cache=2m"/ ],
    [ 'prefix_affinity cache=of;',            qr/invalid cache size "cache=of"/ ],
    [ 'prefix_affinity turns=17;',            qr/invalid turns "turns=17", it must be a number from 0 to 16/ ],
    [ 'prefix_affinity turns=-1;',            qr/invalid turns "turns=-1"/ ],
    [ 'prefix_affinity turns=4 turns=4;',     qr/duplicate parameter "turns=4"/ ],
    [ "response_affinity;\n response_affinity;", qr/"response_affinity" directive is duplicate/ ],
    [ 'response_affinity timeout=0;',         qr/invalid timeout "timeout=0"/ ],
    [ 'response_affinity zone=r:1m zone=s:1m;', qr/duplicate parameter "zone=s:1m"/ ],
    [ 'response_affinity sessions=1;',        qr/invalid parameter "sessions=1"/ ],
    [ "response_affinity;\n affinity_store redis.invalid:6379;", qr/host not found in "affinity_store" address "redis.invalid:6379"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1:0;", qr/invalid port in "affinity_store" address "127.0.0.1:0"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 timeout=10ms;", qr/invalid "timeout=10ms", it must be a time from 100ms to 60s/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 tls_ca=ca.pem;", qr/"tls_name", "tls_ca", "tls_cert" and "tls_key" of "affinity_store" need "tls"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 tls tls_cert=c.pem;", qr/"tls_cert" and "tls_key" of "affinity_store" go together/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 secret=/nonexistent/secret;", qr/open\(\) "\/nonexistent\/secret" failed/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 auth=;", qr/invalid parameter "auth="/ ],
    [ "response_affinity;\n affinity_store unix:/tmp/x.sock tls;", qr/"affinity_store" with "tls" on a unix socket needs "tls_name"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 maxlen=10;", qr/invalid "maxlen=10", it must be a number of 1000 or more/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 backlog=0;", qr/invalid "backlog=0"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1 stream=a stream=b;", qr/duplicate parameter "stream=b"/ ],
    [ "response_affinity;\n affinity_store 127.0.0.1;\n affinity_store 127.0.0.1;", qr/"affinity_store" directive is duplicate/ ],
    [ "session_affinity;\n affinity_metrics interval=10ms;", qr/invalid "interval=10ms", it must be a time from 100ms to 1h/ ],
    [ "session_affinity;\n affinity_metrics path=metrics;", qr/invalid parameter "path=metrics"/ ],
    [ "session_affinity;\n affinity_metrics timeout=1s timeout=2s;", qr/duplicate parameter "timeout=2s"/ ],
    [ "session_affinity;\n affinity_metrics;\n affinity_metrics;", qr/"affinity_metrics" directive is duplicate/ ],
    [ 'affinity_store 127.0.0.1:6379;',       qr/"affinity_balance" in upstream "llm" requires "session_affinity", "prefix_affinity" or "response_affinity"/ ],
);

# a balancing directive after the affinity directives would switch them off
push @bad,
    map { [ "session_affinity;\n prefix_affinity;\n $_;",
            qr/a load balancing directive after "session_affinity" in upstream "llm" in \S+:\d+ replaces it: "hash", "ip_hash", "least_conn" and "random" cannot be combined/ ] }
    ('least_conn', 'hash $request_uri consistent', 'ip_hash', 'random');

for my $case (@bad) {
    my ($directive, $message) = @$case;
    my ($rc, $out) = nginx_t("        $directive\n");
    isnt $rc, 0, "rejected: $directive";
    like $out, $message, '  with a message naming it';
}

my @good = (
    'session_affinity;',
    'session_affinity header=X-Session-ID cookie=llm_session field=prompt_cache_key '
        . 'field=metadata.session_id generate zone=llm_sessions:16m timeout=1h;',
    "session_affinity header=A header=B timeout=90s;\n affinity_balance factor=1.25 slack=2;",
    "affinity_balance factor=2 slack=0;\n session_affinity zone=z:128k;",
    "prefix_affinity;\n affinity_balance;",
);

for my $directive (@good) {
    my ($rc, $out) = nginx_t("        $directive\n");
    is $rc, 0, "accepted: $directive" or diag $out;
}

# accepted, with a warning that names what is wrong
my @warned = (
    [ "least_conn;\n session_affinity;",
      qr/\[warn\] "session_affinity" replaces the load balancing directive given before it in upstream "llm": "hash", "ip_hash", "least_conn" and "random" cannot be combined with it, and "keepalive" and "sticky" must come after it/ ],
    [ 'prefix_affinity step=0 max=64k;',
      qr/\[warn\] "max=64k" is ignored: with step=0 no level is added after lengths=/ ],
    [ 'prefix_affinity step=0 growth=10;',
      qr/\[warn\] "growth=10" is ignored: with step=0/ ],
    [ 'prefix_affinity lengths=100,500,1000 max=800;',
      qr/\[warn\] "max=800" adds no level: it is not above the longest of lengths= \(1000\)/ ],
    [ 'prefix_affinity step=1 growth=0 max=1m;',
      qr/\[warn\] prompts are hashed at 128 levels at most: the longest is \d+ characters, not max=1048576 \(raise step= or growth=\)/ ],
);

# Before 1.29.7 "keepalive" wraps the balancer set when it is read, so one
# set after it replaces it; since, it wraps every balancer once the
# configuration is read, and the order does not matter.
if ($t->nginx_at_least('1.29.7')) {
    my ($rc, $out) = nginx_t("        keepalive 8;\n prefix_affinity;\n");
    is $rc, 0, 'accepted: keepalive before prefix_affinity (nginx 1.29.7+)';
    unlike $out, qr/\[warn\]/, '  without a warning: the order does not matter';
} else {
    push @warned, [ "keepalive 8;\n prefix_affinity;",
      qr/\[warn\] "prefix_affinity" replaces .* "keepalive" and "sticky" must come after it/ ];
}

for my $case (@warned) {
    my ($directive, $message) = @$case;
    my ($rc, $out) = nginx_t("        $directive\n");
    is $rc, 0, "accepted: $directive" or diag $out;
    like $out, $message, '  with a warning naming it';
}

# in the right order, and with the defaults: no warning; 128 levels that
# reach max= (the next one would pass it) are not clipped
for my $directive ("session_affinity;\n prefix_affinity;\n keepalive 8;",
                   'prefix_affinity;', 'prefix_affinity step=0;',
                   'prefix_affinity cache=512k;', 'prefix_affinity cache=off;',
                   'prefix_affinity turns=0;', 'prefix_affinity turns=16;',
                   'prefix_affinity lengths=100 step=1000 growth=0 max=127500;') {
    my ($rc, $out) = nginx_t("        $directive\n");
    is $rc, 0, "accepted: $directive";
    unlike $out, qr/\[warn\]/, '  without a warning' or diag $out;
}

# outside an upstream block
$t->write_conf(proxy_conf($t, $up . "        session_affinity;\n",
                          location => '            session_affinity;'));
my ($rc, $out) = $t->nginx_test;
isnt $rc, 0, 'rejected in a location';
like $out, qr/"session_affinity" directive is not allowed here/, '  not allowed here';

# two upstreams cannot share a zone name with different sizes
$t->write_conf(proxy_conf($t, $up . "        session_affinity zone=shared:1m;\n",
    http => "    upstream other {\n$up        session_affinity zone=shared:2m;\n    }\n"));
($rc, $out) = $t->nginx_test;
isnt $rc, 0, 'a zone declared with two sizes is rejected';
like $out, qr/shared/, '  naming the zone';

done_testing;
