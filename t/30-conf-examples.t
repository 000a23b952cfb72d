#!/usr/bin/env perl

# The deployment examples in conf-examples/ are real configurations: each
# must pass "nginx -t" with this module once the few things that differ
# between a deployment and this machine are changed:
#
#   - load_module points at the module under test;
#   - every upstream server's host name becomes 127.0.0.1 (ports kept);
#   - pid, error_log, access_log and temporary paths go into the test
#     directory; "user" is dropped;
#   - "listen" becomes the harness's port on 127.0.0.1 ("nginx -t" binds
#     listening sockets, and port 80 needs root and may be taken).
#
# The ingress-nginx example is assembled as the controller would: its
# values.yaml's main-snippet in the main context, its http-snippet in http,
# and a server holding ingress.yaml's server-snippet next to a location for
# the Ingress path (the controller's own location, reduced to a proxy_pass
# to the backend Service).
#
# Then each configuration is started for real, its upstream servers moved to
# mock backends, and a few requests check that each location reaches the
# upstream it names, through the module.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Basename qw(basename);
use Test::More;

use AffinityTest;
use AffinityConf qw(log_lines);

my $EXAMPLES = "$FindBin::Bin/../conf-examples";
my $MODULE_SO = 'ngx_http_upstream_affinity_module.so';

sub slurp {
    my ($file) = @_;
    open my $fh, '<', $file or die "read $file: $!";
    local $/;
    return scalar <$fh>;
}

# ---------------------------------------------------------------------------
# YAML: the literal block scalars the examples use ("key: |" or "key: |-").
# The block is every following line indented deeper than the key, blank
# lines included, with the indentation of its first line removed.  This is
# all of YAML these files need; the format is documented in values.yaml and
# ingress.yaml.

sub block_scalar {
    my ($yaml, $key, $file) = @_;
    my @lines = split /\n/, $yaml, -1;
    my @found;

    for my $i (0 .. $#lines) {
        next unless $lines[$i]
            =~ /^( *)(?:\Q$key\E|"\Q$key\E"|'\Q$key\E'):[ ]*\|[-+]?[ ]*(?:#.*)?$/;
        my $key_indent = length $1;
        my ($indent, @body);

        for my $line (@lines[ $i + 1 .. $#lines ]) {
            die "$file: tab in the indentation of $key\n" if $line =~ /^ *\t/;
            if ($line =~ /^ *$/) {
                push @body, '';
                next;
            }
            my $lead = length(($line =~ /^( *)/)[0]);
            last if $lead <= $key_indent;
            $indent //= $lead;
            die "$file: line of $key indented less than its first line: $line\n"
                if $lead < $indent;
            push @body, substr($line, $indent);
        }
        pop @body while @body && $body[-1] eq '';
        push @found, join('', map { "$_\n" } @body);
    }

    die "$file: no block scalar \"$key: |\"\n" unless @found;
    die "$file: \"$key\" found " . scalar(@found) . " times\n" if @found > 1;
    die "$file: $key contains \"{{\", which Helm's tpl would expand\n"
        if $found[0] =~ /\{\{/;
    return $found[0];
}

# ---------------------------------------------------------------------------
# nginx configuration rewriting

# upstream_servers($conf, $map) - calls $map->($upstream, $host, $port) for
# every "server HOST:PORT" directive inside an upstream block and puts the
# address it returns in its place.  Braces inside quotes (log_format) and
# comments are not blocks.  Returns the new text.
sub upstream_servers {
    my ($conf, $map) = @_;
    my (@stack, $quote, $out);
    my $stmt = '';
    $out = '';

    for my $line (split /^/, $conf) {
        if (!defined $quote && @stack && $stack[-1][0] eq 'upstream'
            && $stmt =~ /^\s*$/
            && $line =~ /^(\s*server\s+)([^\s;:]+):(\d+)(?=[\s;])/)
        {
            my ($lead, $host, $port) = ($1, $2, $3);
            my $addr = $map->($stack[-1][1], $host, $port);
            substr($line, 0, length("$lead$host:$port"), "$lead$addr");
        }
        $out .= $line;

        for (my $i = 0; $i < length $line; $i++) {
            my $c = substr $line, $i, 1;
            if (defined $quote) {
                if ($c eq '\\') {
                    $stmt .= substr $line, $i++, 2;
                    next;
                }
                undef $quote if $c eq $quote;
                $stmt .= $c;
            } elsif ($c eq '#' && $stmt =~ /(?:^|\s)$/) {
                $stmt .= ' ';
                last;
            } elsif ($c eq '"' || $c eq "'") {
                $quote = $c;
                $stmt .= $c;
            } elsif ($c eq '{') {
                push @stack, [ split ' ', $stmt ];
                $stmt = '';
            } elsif ($c eq '}') {
                die "unbalanced '}'\n" unless @stack;
                pop @stack;
                $stmt = '';
            } elsif ($c eq ';') {
                $stmt = '';
            } else {
                $stmt .= $c;
            }
        }
    }
    die "unbalanced braces or quotes\n" if @stack || defined $quote;
    return $out;
}

# localize($t, $conf, servers => $map, workers => N) - the rewrites listed
# at the top.  $map as for upstream_servers (default: 127.0.0.1, same port).
sub localize {
    my ($t, $conf, %opt) = @_;
    my $dir = $t->path;
    my $module = $t->module_path;
    my $listen = $t->listen_port;

    $conf =~ s/^[ \t]*user\s[^;]*;[^\n]*\n//mg;

    my $loads = 0;
    $conf =~ s{^([ \t]*)load_module\s+("?)([^\s";]+)\2\s*;}{
        die "unexpected load_module $3\n" unless basename($3) eq $MODULE_SO;
        $loads++;
        qq{$1load_module "$module";}
    }mge;
    die "no load_module for $MODULE_SO\n" unless $loads == 1;

    $conf =~ s{^([ \t]*)pid\s+[^;]+;}{$1pid "$dir/logs/nginx.pid";}mg;

    $conf =~ s{^([ \t]*)(error_log|access_log)\s+("?)([^\s";]+)\3}{
        my ($lead, $name, $path) = ($1, $2, $4);
        $path eq 'off' || $path eq 'stderr' || $path =~ /^(?:syslog|memory):/
            ? "$lead$name $path"
            : qq{$lead$name "$dir/logs/} . basename($path) . '"';
    }mge;

    my @temp = qw(client_body proxy fastcgi uwsgi scgi);
    my %have;
    for my $kind (@temp) {
        $have{$kind} = $conf
            =~ s{^([ \t]*)${kind}_temp_path\s+[^;]+;}{$1${kind}_temp_path "$dir/tmp/$kind";}mg;
    }
    my $missing = join '', map { qq{    ${_}_temp_path "$dir/tmp/$_";\n} }
        grep { !$have{$_} } @temp;
    $conf =~ s{^([ \t]*http\s*\{[^\n]*\n)}{$1$missing}m
        or die "no http block\n";

    $conf =~ s{^([ \t]*)listen\s+[^;]+;}{$1listen 127.0.0.1:$listen;}mg;

    # Running (not just -t): few workers and connections, and no raised
    # file limit, which an unprivileged or containerised test may not get.
    if ($opt{workers}) {
        $conf =~ s{^([ \t]*)worker_processes\s+[^;]+;}{$1worker_processes $opt{workers};}mg;
        $conf =~ s{^([ \t]*)worker_connections\s+[^;]+;}{$1worker_connections 1024;}mg;
        $conf =~ s/^[ \t]*worker_rlimit_nofile\s[^;]*;[^\n]*\n//mg;
    }

    return upstream_servers($conf, $opt{servers} // sub { "127.0.0.1:$_[2]" });
}

# The upstream blocks of a configuration: { name => [ "host:port", ... ] }.
sub upstreams_of {
    my ($conf) = @_;
    my %up;
    upstream_servers($conf, sub {
        push @{ $up{ $_[0] } }, "$_[1]:$_[2]";
        "$_[1]:$_[2]";
    });
    return \%up;
}

# ---------------------------------------------------------------------------
# The configurations

sub ingress_nginx_conf {
    my $values_file  = "$EXAMPLES/ingress-nginx/values.yaml";
    my $ingress_file = "$EXAMPLES/ingress-nginx/ingress.yaml";
    my $values  = slurp($values_file);
    my $ingress = slurp($ingress_file);

    my $main   = block_scalar($values, 'main-snippet', $values_file);
    my $http   = block_scalar($values, 'http-snippet', $values_file);
    my $server = block_scalar($ingress, 'nginx.ingress.kubernetes.io/server-snippet',
                              $ingress_file);
    my ($host) = $ingress =~ /^\s*-?\s*host:\s*(\S+)/m
        or die "$ingress_file: no rule host\n";
    my ($port) = $ingress =~ /^\s*number:\s*(\d+)/m
        or die "$ingress_file: no backend port\n";

    s/^/    /mg for $http;
    s/^/        /mg for $server;

    # The Ingress path "/" as the controller serves it, minus its Lua: the
    # backend Service, reached here through an upstream of its own.
    return <<"EOF";
worker_processes auto;
error_log /var/log/nginx/error.log notice;
pid /run/nginx.pid;
$main
events {
}

http {
    access_log /var/log/nginx/controller-access.log;
$http
    upstream ingress_backend_service {
        server vllm.vllm.svc.cluster.local:$port;
    }

    server {
        listen 80;
        server_name $host;

$server
        location / {
            proxy_pass http://ingress_backend_service;
        }
    }
}
EOF
}

my %conf = (
    'vllm-fleet.conf'   => slurp("$EXAMPLES/vllm-fleet.conf"),
    'sglang-fleet.conf' => slurp("$EXAMPLES/sglang-fleet.conf"),
    'ingress-nginx'     => ingress_nginx_conf(),
);

# ---------------------------------------------------------------------------
# nginx -t

for my $name (sort keys %conf) {
    my $t = AffinityTest->new;
    my $up = upstreams_of($conf{$name});
    ok %$up, "$name: has upstream blocks";

    my $local = localize($t, $conf{$name});
    unlike $local, qr/^\s*server\s+(?!127\.0\.0\.1:)[^\s;]+:\d+[\s;]/m,
        "$name: every upstream server rewritten to 127.0.0.1";

    my $file = $t->path('nginx.conf');
    open my $fh, '>', $file or die "write $file: $!";
    print {$fh} $local;
    close $fh or die "write $file: $!";

    my ($rc, $out) = $t->nginx_test;
    is $rc, 0, "$name: nginx -t accepts it"
        or diag "$out\n--- configuration tested ---\n$local";
}

# ---------------------------------------------------------------------------
# Running them

my $CHAT_PATH = '/v1/chat/completions';
my $JSON = [ 'Content-Type' => 'application/json' ];

sub chat_body {
    my ($text, %extra) = @_;
    my $fields = join '', map { qq{,"$_":"$extra{$_}"} } sort keys %extra;
    return qq({"model":"m","stream":true,"messages":[{"role":"system",)
        . qq("content":"You are a careful assistant."},{"role":"user",)
        . qq("content":"$text"}]$fields});
}

# start($name, workers => 2) - the configuration running against mock
# backends: one backend per distinct upstream server.  Returns the harness
# and { upstream name => [ backend ports ] }.
sub start {
    my ($name) = @_;
    my $t = AffinityTest->new(workers => 2);
    my $up = upstreams_of($conf{$name});

    my (%port_of, %ports);
    for my $u (sort keys %$up) {
        for my $addr (@{ $up->{$u} }) {
            $port_of{$addr} //= $t->start_backends(1);
            push @{ $ports{$u} }, $port_of{$addr};
        }
    }

    my $local = localize($t, $conf{$name}, workers => 2, servers => sub {
        my $port = $port_of{"$_[1]:$_[2]"} // die "no backend for $_[1]:$_[2]\n";
        "127.0.0.1:$port";
    });
    my $file = $t->path('nginx.conf');
    open my $fh, '>', $file or die "write $file: $!";
    print {$fh} $local;
    close $fh or die "write $file: $!";

    $t->start_nginx;
    return ($t, \%ports);
}

sub served_by {
    my ($res) = @_;
    return $res->{headers}{'x-backend-port'} // 'none';
}

sub in_ports {
    my ($port, $ports) = @_;
    return scalar grep { $_ == $port } @$ports;
}

# The "route" fields of the POST requests in a JSON access log, in order.
sub routes_in {
    my ($t, $log) = @_;
    return map { /"request":"POST / && /"route":"([^"]*)"/ ? $1 : () }
        log_lines($t->path("logs/$log"));
}

subtest 'vllm-fleet.conf runs' => sub {
    my ($t, $ports) = start('vllm-fleet.conf');

    my @r = map {
        $t->http(POST => $CHAT_PATH, body => chat_body("turn $_"),
                 headers => [ @$JSON, 'X-Session-ID' => 'conv-1' ])
    } 1 .. 3;
    is_deeply [ map { $_->{status} } @r ], [ 200, 200, 200 ], 'chat requests answered';
    ok in_ports(served_by($r[0]), $ports->{vllm}), '  by a replica of upstream vllm';
    is_deeply [ map { served_by($_) } @r ], [ (served_by($r[0])) x 3 ],
        '  all turns of the session by the same replica';
    is $r[0]{headers}{'x-session-id'}, 'conv-1', '  session id echoed';

    my $anon = $t->http(POST => $CHAT_PATH, body => chat_body('no id'), headers => $JSON);
    is $anon->{status}, 200, 'request without a session id answered';
    like $anon->{headers}{'x-session-id'} // '', qr/^[0-9a-f-]{36}$/, '  and given one';
    like join("\n", @{ $anon->{set_cookie} }), qr/^llm_session=/m, '  in a cookie too';

    for my $path ('/health', '/v1/models') {
        my $res = $t->http(GET => $path);
        is $res->{status}, 200, "$path answered";
        ok in_ports(served_by($res), $ports->{vllm_any}), '  through vllm_any';
        is_deeply $res->{set_cookie}, [], '  without a session cookie';
    }
    is $t->http(GET => '/metrics')->{status}, 404, 'other paths are not proxied';

    # Sorted: with several workers a log line can be written after the
    # next request's.
    # The request without an id got a generated one: it is reported by
    # what placed it, its prompt.
    my @routes = sort(routes_in($t, 'llm-access.log'));
    my ($placed) = grep { /^prefix_/ } @routes;
    is_deeply [ grep { !/^prefix_/ } @routes ],
        [ sort qw(session_new session_hit session_hit) ],
        'access log records the routes';
    like $placed // '', qr/^prefix_(?:hit|new)$/,
        '  the generated id by its prompt (' . ($placed // 'none') . ')';
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

subtest 'sglang-fleet.conf runs' => sub {
    my ($t, $ports) = start('sglang-fleet.conf');
    my $prompt = 'Summarise the following design document. ' x 40;

    my @r = map {
        $t->http(POST => $CHAT_PATH, body => chat_body($prompt), headers => $JSON)
    } 1 .. 2;
    is_deeply [ map { $_->{status} } @r ], [ 200, 200 ], 'chat requests answered';
    ok in_ports(served_by($r[0]), $ports->{sglang_chat}), '  by the chat fleet';
    is served_by($r[1]), served_by($r[0]), '  the same prompt by the same replica';

    my $code = $t->http(POST => "/coder$CHAT_PATH", body => chat_body('fix the bug'),
                        headers => $JSON);
    is $code->{status}, 200, '/coder/v1/ answered';
    ok in_ports(served_by($code), $ports->{sglang_coder}), '  by the code fleet';

    my $health = $t->http(GET => '/health');
    is $health->{status}, 200, '/health answered';
    ok in_ports(served_by($health), $ports->{sglang_chat}), '  by the chat fleet';
    my $coder_health = $t->http(GET => '/coder/health');
    is $coder_health->{status}, 200, '/coder/health answered';
    ok in_ports(served_by($coder_health), $ports->{sglang_coder}), '  by the code fleet';

    is_deeply [ sort(routes_in($t, 'sglang-access.log')) ],
        [ sort qw(prefix_new prefix_hit prefix_new) ],
        'access log: the repeated prompt found its prefix';
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

subtest 'ingress-nginx snippets run' => sub {
    my ($t, $ports) = start('ingress-nginx');

    my @r = map {
        $t->http(POST => $CHAT_PATH, headers => $JSON,
                 body => chat_body("turn $_", prompt_cache_key => 'user-42'))
    } 1 .. 3;
    is_deeply [ map { $_->{status} } @r ], [ 200, 200, 200 ], '/v1/ answered';
    ok in_ports(served_by($r[0]), $ports->{llm_affinity}), '  by the affinity upstream';
    is_deeply [ map { served_by($_) } @r ], [ (served_by($r[0])) x 3 ],
        '  prompt_cache_key keeps one replica';
    is $r[0]{headers}{'x-session-id'}, 'user-42', '  and is echoed as X-Session-ID';

    my $other = $t->http(GET => '/health');
    is $other->{status}, 200, 'paths outside /v1/ answered';
    ok in_ports(served_by($other), $ports->{ingress_backend_service}),
        '  by the Ingress backend';

    is_deeply [ sort(routes_in($t, 'access.log')) ],
        [ sort qw(session_new session_hit session_hit) ],
        'access log records the routes';
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

done_testing;
