#!/usr/bin/env perl

# The container and Kubernetes examples are real configurations.  Each is
# put together as nginx would get it, checked with "nginx -t", and run:
#
#   docker                    conf-examples/docker/nginx.conf, with
#                             default.conf as its conf.d/;
#   kubernetes                the nginx.conf of
#                             conf-examples/kubernetes/nginx-configmap.yaml;
#   nginx-ingress-controller  F5 NGINX Ingress Controller's main template
#                             (as far as the snippets care: the main context,
#                             http, a server per Ingress host with a location
#                             per path) with values.yaml's main-snippets and
#                             http-snippets, and ingress.yaml's
#                             nginx.org/server-snippets in the server.
#
# What differs between a cluster and this machine is changed as t/30 does
# (the module under test, paths in the test directory, the harness's port,
# no "user"), and the cluster DNS becomes t/dns.pl: "resolver" points at it
# (with valid=1s, so that a change is seen within the test) and it answers
# the headless Service's name with loopback addresses where backends run.
#
# Servers with "resolve" need nginx 1.27.3 or later.  With an older nginx
# the examples are tested the way conf-examples/kubernetes/README.md tells
# users of older nginx to run them: "resolve" removed, the name resolved
# when nginx loads its configuration (here: 127.0.0.1), "zone" kept.  The
# test says which on its first line.
#
# Also: every YAML file of these examples (and of ingress-nginx's) parses,
# when Debian's python3-yaml is installed.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Basename qw(basename);
use Test::More;
use Time::HiRes qw(sleep time);

use AffinityTest;

my $EXAMPLES  = "$FindBin::Bin/../conf-examples";
my $MODULE_SO = 'ngx_http_upstream_affinity_module.so';
my $RESOLVE_SINCE = '1.27.3';
my $HEADLESS  = 'vllm-headless.llm.svc.cluster.local';
my $JSON      = [ 'Content-Type' => 'application/json' ];

my ($VERSION, $RESOLVE) = do {
    my $probe = AffinityTest->new;
    ($probe->nginx_version // '?', $probe->nginx_at_least($RESOLVE_SINCE));
};
diag $RESOLVE
    ? "nginx $VERSION: the examples are tested as written, with \"resolve\""
      . " (names answered by t/dns.pl)"
    : "nginx $VERSION is older than $RESOLVE_SINCE (no \"resolve\"): the"
      . " examples are tested as kubernetes/README.md has older nginx run"
      . " them (\"resolve\" removed, the name resolved at load to 127.0.0.1)";

sub slurp {
    my ($file) = @_;
    open my $fh, '<', $file or die "read $file: $!";
    local $/;
    return scalar <$fh>;
}

sub spew {
    my ($file, $text) = @_;
    open my $fh, '>', $file or die "write $file: $!";
    print {$fh} $text;
    close $fh or die "write $file: $!";
}

# ---------------------------------------------------------------------------
# YAML: the text of a literal block scalar ("key: |"), found exactly once.
# Its lines are those after the key indented deeper than the key (blank
# lines included), less the indentation of the first.

sub block_scalar {
    my ($file, $key) = @_;
    my @lines = split /\n/, slurp($file), -1;
    my @found;

    for my $i (0 .. $#lines) {
        next unless $lines[$i]
            =~ /^( *)(["']?)\Q$key\E\2:\s*\|[-+]?\s*(?:#.*)?$/;
        my ($key_indent, $indent, @body) = (length $1);
        for my $line (@lines[ $i + 1 .. $#lines ]) {
            die "$file: tab in $key\n" if $line =~ /^ *\t/;
            if ($line =~ /^\s*$/) {
                push @body, '';
                next;
            }
            my ($lead) = map { length } $line =~ /^( *)/;
            last if $lead <= $key_indent;
            $indent //= $lead;
            die "$file: a line of $key is indented less than its first\n"
                if $lead < $indent;
            push @body, substr $line, $indent;
        }
        pop @body while @body && $body[-1] eq '';
        push @found, join '', map { "$_\n" } @body;
    }
    die "$file: \"$key: |\" found " . @found . " times, not once\n"
        unless @found == 1;
    return $found[0];
}

# ---------------------------------------------------------------------------
# nginx configuration

# upstream_servers($conf, $map) - the text with every "server ..." statement
# of an upstream block replaced by $map->($upstream, $host, $port, $rest),
# where $rest is what follows HOST:PORT up to the ";".  Statements may span
# lines; quotes (log_format) and comments hold no blocks.
sub upstream_servers {
    my ($conf, $map) = @_;
    my ($out, $start, $quote, @stack) = ('', 0);

    for (my $i = 0; $i < length $conf; $i++) {
        my $c = substr $conf, $i, 1;
        $out .= $c;
        if (defined $quote) {
            if ($c eq '\\') {
                $out .= substr $conf, ++$i, 1;
            } elsif ($c eq $quote) {
                undef $quote;
            }
            next;
        }
        if ($c eq '#') {
            my $end = index $conf, "\n", $i;
            $end = length $conf if $end < 0;
            $out .= substr $conf, $i + 1, $end - $i - 1;
            $i = $end - 1;
        } elsif ($c eq '"' || $c eq "'") {
            $quote = $c;
        } elsif ($c eq '{') {
            my $stmt = substr $out, $start, -1;
            $stmt =~ s/#[^\n]*//g;
            push @stack, [ split ' ', $stmt ];
            $start = length $out;
        } elsif ($c eq '}') {
            die "unbalanced '}'\n" unless @stack;
            pop @stack;
            $start = length $out;
        } elsif ($c eq ';') {
            my $stmt = substr $out, $start;
            if (@stack && $stack[-1][0] eq 'upstream'
                && $stmt =~ /\A((?:\s*\#[^\n]*\n)*\s*server\s+)
                               ([^\s;:]+):(\d+)(.*);\z/sx)
            {
                my ($lead, $host, $port, $rest) = ($1, $2, $3, $4);
                substr($out, $start) = $lead
                    . $map->($stack[-1][1], $host, $port, $rest) . ';';
            }
            $start = length $out;
        }
    }
    die "unbalanced braces or quotes\n" if @stack || defined $quote;
    return $out;
}

# The upstream servers of a configuration: [ upstream, host, port, rest ].
sub servers_of {
    my ($conf) = @_;
    my @servers;
    upstream_servers($conf, sub { push @servers, [@_]; "$_[1]:$_[2]$_[3]" });
    return @servers;
}

# localize($t, $conf, %opt) - the configuration for this machine:
#   the module under test, no "user", pid and logs in the test directory,
#   temporary paths there too, "listen" on the harness's port;
#   "include .../conf.d/*.conf" from $opt{conf_d};
#   "resolver" at 127.0.0.1:$opt{dns} (a port where nothing answers when
#   not given), valid=1s;
#   upstream servers: with an nginx older than 1.27.3, "resolve" removed
#   (as README.md has users do) and the host 127.0.0.1; then
#   $opt{servers}->(upstream, host, port, rest) gives "HOST:PORT REST"
#   (default: a "resolve" server keeps its name, others get 127.0.0.1);
#   $opt{run}: 2 workers, 1024 connections, no worker_rlimit_nofile.
sub localize {
    my ($t, $conf, %opt) = @_;
    my $dir = $t->path;

    $conf =~ s/^[ \t]*user\s[^;]*;[^\n]*\n//mg;

    my $loads = 0;
    $conf =~ s{^([ \t]*)load_module\s+("?)([^\s";]+)\2\s*;}{
        die "load_module of another module: $3\n"
            unless basename($3) eq $MODULE_SO;
        $loads++;
        qq{$1load_module "} . $t->module_path . '";';
    }mge;
    die "no load_module of $MODULE_SO\n" unless $loads == 1;

    $conf =~ s{^([ \t]*)pid\s+[^;]+;}{$1pid "$dir/logs/nginx.pid";}mg;
    $conf =~ s{^([ \t]*)(error_log|access_log)\s+("?)([^\s";]+)\3}{
        my ($lead, $name, $path) = ($1, $2, $4);
        $path =~ /^(?:off|stderr|syslog:.*|memory:.*)$/
            ? "$lead$name $path"
            : qq{$lead$name "$dir/logs/} . basename($path) . '"';
    }mge;

    my $tmp = $t->path('tmp');
    my $temp = join '', map { qq{    ${_}_temp_path "$tmp/$_";\n} }
        qw(client_body proxy fastcgi uwsgi scgi);
    $conf =~ s{^([ \t]*http\s*\{[^\n]*\n)}{$1$temp}m or die "no http block\n";

    my $listen = '127.0.0.1:' . $t->listen_port;
    $conf =~ s{^([ \t]*)listen\s+[^;]+;}{$1listen $listen;}mg;

    # mime.types of the nginx package, where this machine has it.
    $conf =~ s{^[ \t]*include\s+(\S*mime\.types)\s*;[^\n]*\n}{
        -e $1 ? $& : ''
    }mge;
    $conf =~ s{^([ \t]*)include\s+\S*/conf\.d/\*\.conf\s*;}{
        die "conf.d included, none given\n" unless $opt{conf_d};
        qq{$1include "$opt{conf_d}/*.conf";}
    }mge;

    my $dns = $opt{dns} // $t->port;
    $conf =~ s{^([ \t]*)resolver\s+\S+([^;]*);}{
        my ($lead, $params) = ($1, $2);
        $params =~ s/\bvalid=\S+/valid=1s/;
        "${lead}resolver 127.0.0.1:$dns$params;";
    }mge;

    if ($opt{run}) {
        $conf =~ s{^([ \t]*)worker_processes\s+[^;]+;}{$1worker_processes 2;}mg;
        $conf =~ s{^([ \t]*)worker_connections\s+[^;]+;}
                  {$1worker_connections 1024;}mg;
        $conf =~ s/^[ \t]*worker_rlimit_nofile\s[^;]*;[^\n]*\n//mg;
    }

    # A "resolve" server keeps its name, for the resolver; any other is
    # resolved at load, and becomes 127.0.0.1.
    my $servers = $opt{servers} // sub {
        my ($upstream, $host, $port, $rest) = @_;
        $rest =~ /\bresolve\b/ ? "$host:$port$rest" : "127.0.0.1:$port$rest";
    };
    return upstream_servers($conf, sub {
        my ($upstream, $host, $port, $rest) = @_;
        if ($rest =~ /\bresolve\b/ && !$RESOLVE) {
            # As README.md has older nginx do: without "resolve", the name
            # is resolved once, at load.
            $rest =~ s/\s+resolve\b//;
            return $servers->($upstream, '127.0.0.1', $port, $rest);
        }
        return $servers->($upstream, $host, $port, $rest);
    });
}

# ---------------------------------------------------------------------------
# The configurations, as the software that runs them puts them together

sub docker_conf {
    my ($t) = @_;
    my $conf_d = $t->path('conf.d');
    mkdir $conf_d or die "mkdir $conf_d: $!";
    # default.conf has no main or http context of its own: localize() only
    # changes its "listen".
    my $default = slurp("$EXAMPLES/docker/default.conf");
    my $listen = '127.0.0.1:' . $t->listen_port;
    $default =~ s{^([ \t]*)listen\s+[^;]+;}{$1listen $listen;}mg;
    spew("$conf_d/default.conf", $default);
    return (slurp("$EXAMPLES/docker/nginx.conf"), conf_d => $conf_d);
}

sub kubernetes_conf {
    return block_scalar("$EXAMPLES/kubernetes/nginx-configmap.yaml",
                        'nginx.conf');
}

# F5 NGINX Ingress Controller: main-snippets after "pid" in the main
# context, http-snippets at the top of http, and for the Ingress a server
# with the server-snippets before the locations of its paths, each with a
# proxy_pass to the upstream the controller makes of the backend Service's
# endpoints (here one, on the Service's port).
sub nic_conf {
    my $values  = "$EXAMPLES/nginx-ingress-controller/values.yaml";
    my $ingress = "$EXAMPLES/nginx-ingress-controller/ingress.yaml";
    my $main   = block_scalar($values, 'main-snippets');
    my $http   = block_scalar($values, 'http-snippets');
    my $server = block_scalar($ingress, 'nginx.org/server-snippets');
    my $text = slurp($ingress);
    my ($host) = $text =~ /^\s*-?\s*host:\s*(\S+)/m
        or die "$ingress: no host\n";
    my ($port) = $text =~ /^\s*number:\s*(\d+)/m or die "$ingress: no port\n";

    s/^(?=.)/    /mg for $http;
    s/^(?=.)/        /mg for $server;
    my $upstream = "llm-vllm-$host-vllm-$port";

    return <<"EOF";
worker_processes auto;
error_log /var/log/nginx/error.log notice;
pid /var/lib/nginx/nginx.pid;

$main
events {
    worker_connections 1024;
}

http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
$http
    log_format main '\$remote_addr "\$request" \$status';
    access_log /var/log/nginx/access.log main;

    upstream $upstream {
        zone $upstream 256k;
        random two least_conn;
        server vllm.llm.svc.cluster.local:$port max_fails=1 fail_timeout=10s
               max_conns=0;
    }

    server {
        listen 80;
        server_name $host;

$server
        location / {
            set \$service "vllm";
            proxy_http_version 1.1;
            proxy_pass http://$upstream;
        }
    }
}
EOF
}

# ---------------------------------------------------------------------------
# nginx -t on each

my %built = (
    docker                     => \&docker_conf,
    kubernetes                 => \&kubernetes_conf,
    'nginx-ingress-controller' => \&nic_conf,
);

for my $name (sort keys %built) {
    my $t = AffinityTest->new;
    my ($conf, %opt) = $built{$name}->($t);
    my $local = localize($t, $conf, %opt);
    spew($t->path('nginx.conf'), $local);

    my ($rc, $out) = $t->nginx_test;
    is $rc, 0, "$name: nginx -t accepts it"
        or diag "$out\n--- configuration tested ---\n$local";

    my @left = grep { $_->[1] ne '127.0.0.1' } servers_of($local);
    if ($RESOLVE) {
        ok !(grep { $_->[3] !~ /\bresolve\b/ } @left),
            "$name: only \"resolve\" servers keep a host name";
    } else {
        is scalar @left, 0, "$name: every server resolved at load (127.0.0.1)";
    }
}

# A store line, as README.md has users enable it with more than one nginx.
{
    my $t = AffinityTest->new;
    my $conf = kubernetes_conf();
    ok $conf =~ s{^(\s*)#\s*(affinity_store\s[^;]*;)}{
            my ($indent, $block) = ($1, $2);
            $block =~ s/^\s*#/$indent/mg;
            "$indent$block";
        }me,
        'kubernetes: the affinity_store lines are there to enable';
    like $conf, qr{auth=/etc/nginx/store/password\s+secret=/etc/nginx/store/secret;},
        'kubernetes: with the password and secret of its Secret';

    # the Secret's files, as the Deployment mounts them
    mkdir $t->path('store');
    spew($t->path('store/password'), "password-of-redis\n");
    spew($t->path('store/secret'), "a-secret-of-the-nginx-replicas\n");
    chmod 0400, map { $t->path("store/$_") } qw(password secret);
    (my $stored = $conf) =~ s{/etc/nginx/store/}{$t->path('store') . '/'}ge;
    spew($t->path('nginx.conf'), localize($t, $stored));
    my ($rc, $out) = $t->nginx_test;
    is $rc, 0, 'kubernetes: nginx -t accepts it with affinity_store enabled'
        or diag $out;
}

# ---------------------------------------------------------------------------
# Running them

sub chat {
    my ($text, %extra) = @_;
    my $fields = join '', map { qq{,"$_":"$extra{$_}"} } sort keys %extra;
    return qq({"model":"m","messages":[{"role":"user",)
         . qq("content":"$text"}]$fields});
}

# Where a response came from: "ADDR:PORT" of a backend off 127.0.0.1, the
# port of one on it.
sub served_by {
    my ($res) = @_;
    my $h = $res->{headers};
    return $h->{'x-backend-addr'} // $h->{'x-backend-port'}
        // "status $res->{status}";
}

# start($t, $conf, %opt) - $conf running against backends: each upstream
# server gets one backend, a "resolve" server two (127.0.0.2 and .3, the
# DNS answer for its name, on one port).  Returns { upstream => [ where a
# response from it says it came from ] }.
sub start {
    my ($t, $conf, %opt) = @_;
    my (%by, %dns);
    my $dns = $t->start_dns;    # its names once the servers are known
    my $local = localize($t, $conf, %opt, run => 1, dns => $dns,
        servers => sub {
            my ($upstream, $host, $port, $rest) = @_;
            my $new = $t->port;
            if ($rest !~ /\bresolve\b/) {
                $t->start_backend($new);
                push @{ $by{$upstream} }, $new;
            } else {
                my @addrs = ('127.0.0.2', '127.0.0.3');
                push @{ $by{$upstream} },
                    map { $t->start_backend_at($_, $new) } @addrs;
                $dns{$host} = \@addrs;
            }
            my $addr = $rest =~ /\bresolve\b/ ? $host : '127.0.0.1';
            return "$addr:$new$rest";
        });
    $t->set_dns(%dns);
    spew($t->path('nginx.conf'), $local);
    $t->start_nginx;
    return \%by;
}

# Waits until requests to $path reach exactly the backends @want.
sub reaches {
    my ($t, $path, @want) = @_;
    my $want = join ' ', sort @want;
    my $seen = '';
    my $deadline = time + 20;
    while (time < $deadline) {
        my %at;
        $at{ served_by($t->http(POST => $path, headers => $JSON,
                                body => chat("probe $_"))) }++ for 1 .. 20;
        $seen = join ' ', sort keys %at;
        return 1 if $seen eq $want;
        sleep 0.3;
    }
    diag "requests reach: $seen";
    return 0;
}

sub check_affinity_upstream {
    my ($t, $path, $peers, %opt) = @_;
    my $host = $opt{host} ? [ Host => $opt{host} ] : [];

    ok reaches($t, $path, @$peers),
        'requests reach ' . (@$peers > 1 ? 'every replica' : 'the replica')
        . ' of the affinity upstream';

    my @r = map {
        $t->http(POST => $path, headers => [ @$JSON, @$host ],
                 body => chat("turn $_", prompt_cache_key => 'user-42'))
    } 1 .. 4;
    is_deeply [ map { $_->{status} } @r ], [ (200) x 4 ],
        'chat requests answered';
    is_deeply [ map { served_by($_) } @r ], [ (served_by($r[0])) x 4 ],
        '  prompt_cache_key keeps one replica';
    is $r[0]{headers}{'x-session-id'}, 'user-42',
        '  and is echoed as X-Session-ID';

    my @s = map {
        $t->http(POST => $path, body => chat("hello $_"),
                 headers => [ @$JSON, @$host, 'X-Session-ID' => 'conv-7' ])
    } 1 .. 3;
    is_deeply [ map { served_by($_) } @s ], [ (served_by($s[0])) x 3 ],
        '  so does X-Session-ID';
}

subtest 'docker: the image configuration runs' => sub {
    my $t = AffinityTest->new(workers => 2);
    my ($conf, %opt) = docker_conf($t);
    start($t, $conf, %opt);
    is $t->http(GET => '/healthz')->{status}, 200, '/healthz answers 200';
    is $t->http(GET => '/')->{status}, 404, 'other paths 404';
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

subtest 'kubernetes: the ConfigMap nginx.conf runs' => sub {
    my $t = AffinityTest->new(workers => 2);
    my $by = start($t, kubernetes_conf());
    my @peers = @{ $by->{vllm} };
    is scalar @peers, $RESOLVE ? 2 : 1,
        $RESOLVE ? 'the headless name stands for two replicas'
                 : 'the name stands for the one address it had at load';

    check_affinity_upstream($t, '/v1/chat/completions', \@peers);

    is $t->http(GET => '/healthz')->{status}, 200, '/healthz answers 200';
    my $status = $t->http(GET => '/affinity/status');
    is $status->{status}, 200, '/affinity/status answers';
    like $status->{body}, qr/"vllm"/, '  and lists the upstream';
    my $metrics = $t->http(GET => '/metrics');
    is $metrics->{status}, 200, '/metrics answers';
    like $metrics->{body}, qr/^nginx_upstream_affinity_peer_requests_total\{/m,
        '  in the Prometheus format';
    is $t->http(GET => '/other')->{status}, 404, 'other paths 404';

    SKIP: {
        skip "nginx $VERSION has no \"resolve\" ($RESOLVE_SINCE+): the"
            . ' upstream cannot follow the DNS answer', 1 unless $RESOLVE;
        $t->set_dns($HEADLESS => ['127.0.0.3']);
        ok reaches($t, '/v1/chat/completions',
                   grep { /^127\.0\.0\.3:/ } @peers),
            'a replica that leaves the DNS answer stops getting requests';
    }
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

subtest 'nginx-ingress-controller: the snippets run' => sub {
    my $t = AffinityTest->new(workers => 2);
    my $by = start($t, nic_conf());
    my ($ingress) = grep { $_ ne 'llm_affinity' } keys %$by;
    my $host = [ Host => 'llm.example.com' ];

    check_affinity_upstream($t, '/v1/chat/completions', $by->{llm_affinity},
                            host => 'llm.example.com');

    my $other = $t->http(GET => '/health', headers => $host);
    is $other->{status}, 200, 'paths outside /v1/ answered';
    is served_by($other), $by->{$ingress}[0], '  by the Ingress backend';
    is $t->http(GET => '/affinity/status', headers => $host)->{status}, 200,
        '/affinity/status answers';
    is_deeply [ $t->log_problems ], [], 'no alerts in error.log';
};

# ---------------------------------------------------------------------------
# YAML

subtest 'the YAML files parse' => sub {
    my @files = map { glob "$EXAMPLES/$_/*.yaml" }
        qw(kubernetes nginx-ingress-controller ingress-nginx);
    ok scalar @files, scalar(@files) . ' YAML files';

    my $python = $ENV{PYTHON}
        // (-x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3');
    my $have = system("'$python' -c 'import yaml' 2>/dev/null") == 0;
    SKIP: {
        skip 'no python3-yaml (Debian package python3-yaml) to parse them',
            scalar @files unless $have;
        # Prints the kinds of the documents in a file, "-" for none.
        my $script = <<'PY';
import sys, yaml
with open(sys.argv[1]) as f:
    docs = [d for d in yaml.safe_load_all(f) if d is not None]
print(" ".join(str(d.get("kind", "-")) for d in docs))
PY
        for my $file (@files) {
            open my $py, '-|', $python, '-c', $script, $file
                or die "$python: $!";
            my $out = do { local $/; <$py> } // '';
            close $py;
            chomp $out;
            is $?, 0, basename($file) . ": parses ($out)";
        }
    }
};

done_testing;
