package AffinityTest;

=head1 NAME

AffinityTest - harness for the upstream affinity module tests

=head1 SYNOPSIS

    use FindBin;
    use lib "$FindBin::Bin/lib";
    use Test::More;
    use AffinityTest;

    my $t = AffinityTest->new;
    my @ports = $t->start_backends(3, delay_ms => 0);
    my $listen = $t->listen_port;

    $t->write_conf(<<"EOF");
        upstream app { server 127.0.0.1:$ports[0]; server 127.0.0.1:$ports[1]; }
        server {
            listen 127.0.0.1:$listen;
            location / { proxy_pass http://app; }
        }
    EOF
    $t->start_nginx;

    my $res = $t->http(GET => '/');
    is $res->{status}, 200;

Servers found through DNS (C<server NAME resolve;>, nginx 1.27.3 or later):

    my $port = $t->port;
    my @keys = map { $t->start_backend_at("127.0.0.$_", $port) } 2 .. 3;
    my $dns  = $t->start_dns('app.test' => ['127.0.0.2', '127.0.0.3']);

    $t->write_conf(<<"EOF");
        resolver 127.0.0.1:$dns valid=1s ipv6=off;
        upstream app { zone app 64k; server app.test:$port resolve; }
        ...
    EOF
    $t->start_nginx;
    $t->set_dns('app.test' => ['127.0.0.3']);    # 127.0.0.2 leaves

=head1 DESCRIPTION

Runs a private nginx (with the module loaded) against mock backends
(F<t/backend.pl>) and a mock DNS server (F<t/dns.pl>) in a fresh temporary
directory, and offers small HTTP and DNS client helpers.  Everything listens
on loopback addresses: nginx, the DNS server and backends started with
C<start_backends> / C<start_backend> on 127.0.0.1, backends started with
C<start_backend_at> on any address of 127.0.0.0/8 (all local on Linux).

A backend is named by a I<key>: its port if it listens on 127.0.0.1 (so
plain port numbers work as they always have), C<"ADDR:PORT"> otherwise.
Every method that takes a backend (C<stop_backend>, C<backend_stats>,
C<backend_reset>, C<backend_tags>, C<backend_release>, the C<port> of
C<http>) accepts a key.

The DNS server answers A queries from a records file that C<set_dns>
replaces atomically; it is read again for every query, so the next query
after C<set_dns> returns sees the new addresses.  How soon nginx asks again
is nginx's business: after a successful answer it re-resolves a C<resolve>
server when the TTL (1 s by default, see C<start_dns>) or the C<resolver>'s
C<valid=> time has passed, plus one second; after NXDOMAIN (or a name with
no addresses) it removes all the name's peers and asks again only after
C<valid=> or 10 s, so tests that empty a name should set C<valid=1s>.

Environment:

    AFFINITY_MODULE      path of the module .so
                         (default: <repo>/build/ngx_http_upstream_affinity_module.so)
    NGINX_BIN            nginx binary (default: /usr/sbin/nginx, else nginx in PATH)
    AFFINITY_TEST_KEEP   if 1, keep the temporary directory after the test
    AFFINITY_SANITIZE    if 1, the module is a sanitizer build (see below);
                         the default module is then
                         <repo>/build/asan/ngx_http_upstream_affinity_module.so

A missing module or nginx binary is a hard failure (BAIL_OUT), never a skip.

=head2 Sanitizer builds

C<scripts/build-module.sh --sanitize> builds the module with
AddressSanitizer and UndefinedBehaviorSanitizer.  With AFFINITY_SANITIZE=1
the harness runs nginx (which is not sanitized itself) with the sanitizer
runtime preloaded: LD_PRELOAD names the libasan the module is linked
against (as ldd finds it; AFFINITY_SANITIZE_PRELOAD overrides), and
ASAN_OPTIONS and UBSAN_OPTIONS send every report to a file under
F<sanitizer/> in the test directory (leak detection is off: nginx does not
free everything at exit).  Options already in ASAN_OPTIONS or UBSAN_OPTIONS
are kept, but not their log_path.  nginx empties its workers' environment,
but the workers are forked from the master and keep the runtime.

Any report file is a failure: C<log_problems> returns a line for each (and
shows the whole report with C<diag>), and when the test object is cleaned up
a test that still passes in spite of a report fails one more test.
C<log_problems> also returns what a sanitizer or a failed assertion of the
core (built without NDEBUG) wrote to stderr, in error.log or
F<logs/nginx.out>.

Timeouts for nginx starting, reloading and stopping are four times as long,
and the default one of C<http> twice as long.  C<sanitized> tells a test
that the module is a sanitizer build.

All processes started by the harness are stopped when the object is
destroyed or the test program exits, even if the test dies.

=head1 METHODS

See the comment above each method.

=cut

use strict;
use warnings;

use Carp qw(croak);
use Cwd qw(abs_path);
use Errno qw(EAGAIN EWOULDBLOCK EINTR EINPROGRESS);
use Fcntl qw(F_GETFL F_SETFL O_NONBLOCK);
use File::Basename qw(dirname);
use File::Spec;
use File::Temp ();
use IO::Select;
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Scalar::Util qw(weaken);
use Socket qw(PF_INET SOCK_STREAM IPPROTO_TCP SOL_SOCKET SO_ERROR
              pack_sockaddr_in inet_aton);
use Test::More ();
use Time::HiRes qw(time sleep);

my $T_DIR     = dirname(dirname(abs_path(__FILE__)));    # .../t
my $REPO_DIR  = dirname($T_DIR);
my $BACKEND   = File::Spec->catfile($T_DIR, 'backend.pl');
my $MOCK      = File::Spec->catfile($REPO_DIR, 'bench', 'sim', 'mock_backend.py');
my $PYTHON    = $ENV{PYTHON} // (-x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3');
my $DNS       = File::Spec->catfile($T_DIR, 'dns.pl');
my $LOCALHOST = '127.0.0.1';
my $MODULE_SO = 'ngx_http_upstream_affinity_module.so';

# A sanitizer build of the module (see "Sanitizer builds" above).
my $SANITIZE = ($ENV{AFFINITY_SANITIZE} // '') !~ /^0?$/;
my $SLOW     = $SANITIZE ? 4 : 1;    # for nginx start, reload and stop
my $HTTP_TIMEOUT = $SANITIZE ? 60 : 30;

my %USED_PORTS;    # ports handed out by port() in this process
my %REDIS_PASSWORD;    # of the redis-servers started, by port
my @INSTANCES;     # weak references, for cleanup in END

# Writing to a connection the peer already closed must not kill the test,
# and an interrupted test must still stop its processes (END blocks run).
$SIG{PIPE} = 'IGNORE';
my %SIGNUM = (HUP => 1, INT => 2, TERM => 15);
for my $sig (keys %SIGNUM) {
    next if $SIG{$sig} && $SIG{$sig} ne 'DEFAULT';
    $SIG{$sig} = sub { exit 128 + $SIGNUM{$sig} };
}

END {
    my $status = $?;
    $_ && $_->_cleanup for @INSTANCES;
    $? = $status;
}

# ---------------------------------------------------------------------------
# Construction

# AffinityTest->new(no_module => 0, workers => 4)
sub new {
    my ($class, %opt) = @_;

    my $keep = ($ENV{AFFINITY_TEST_KEEP} // '') eq '1';
    my $dir  = File::Temp->newdir('affinity-test-XXXXXX', TMPDIR => 1, CLEANUP => !$keep);

    my $self = bless {
        owner     => $$,
        tmpdir    => $dir,    # the File::Temp object removes the directory
        dir       => $dir->dirname,
        no_module => $opt{no_module} ? 1 : 0,
        workers   => $opt{workers} // 4,    # default for write_conf
        backends  => {},      # key => { pid, host, port, delay_ms }
        dns       => undef,   # { pid, port, records } while running
    }, $class;

    # nginx workers run as an unprivileged user when started by root.
    chmod 0755, $self->{dir};
    for my $sub (qw(logs tmp)) {
        mkdir $self->path($sub) or croak "mkdir $sub: $!";
        chmod 0755, $self->path($sub);
    }

    $self->{nginx}  = _find_nginx();
    $self->{module} = File::Spec->rel2abs($ENV{AFFINITY_MODULE}
        // File::Spec->catfile($REPO_DIR, 'build', $SANITIZE ? 'asan' : (),
                               $MODULE_SO));

    Test::More::BAIL_OUT(defined $ENV{NGINX_BIN}
            ? "NGINX_BIN is not an executable: $ENV{NGINX_BIN}"
            : 'nginx binary not found (set NGINX_BIN or install nginx)')
        unless defined $self->{nginx};
    Test::More::BAIL_OUT("module not found: $self->{module} "
            . '(build it first, or set AFFINITY_MODULE)')
        unless $self->{no_module} || -f $self->{module};

    if ($SANITIZE) {
        $self->{sanitizer_preload} = $self->_sanitizer_preload;
        # Written by the workers too, which do not run as root.
        my $reports = $self->path('sanitizer');
        # The sanitizers split their options at spaces and colons.
        croak "a sanitizer log_path cannot be $reports (set TMPDIR)"
            if $reports =~ /[\s:]/;
        mkdir $reports or croak "mkdir $reports: $!";
        chmod 01777, $reports;
        $self->{sanitizer_seen} = {};
    }

    $self->{listen_port} = $self->port;
    Test::More::diag("test directory kept: $self->{dir}") if $keep;

    push @INSTANCES, $self;
    weaken($INSTANCES[-1]);
    return $self;
}

sub _find_nginx {
    return $ENV{NGINX_BIN} if defined $ENV{NGINX_BIN} && -x $ENV{NGINX_BIN};
    return undef if defined $ENV{NGINX_BIN};
    return '/usr/sbin/nginx' if -x '/usr/sbin/nginx';
    for my $dir (File::Spec->path) {
        my $bin = File::Spec->catfile($dir, 'nginx');
        return $bin if -f $bin && -x _;
    }
    return undef;
}

# $t->path($rel) - absolute path of $rel inside the test directory.
sub path {
    my ($self, $rel) = @_;
    return defined $rel ? File::Spec->catfile($self->{dir}, $rel) : $self->{dir};
}

# $t->listen_port - port reserved for the test's nginx server block.
sub listen_port { $_[0]{listen_port} }

# $t->module_path, $t->nginx_bin - what is being tested.
sub module_path { $_[0]{module} }
sub nginx_bin   { $_[0]{nginx} }

# $t->sanitized - whether the module is a sanitizer build (AFFINITY_SANITIZE):
# slower, and a worker's resident memory includes what AddressSanitizer
# holds back (freed memory in quarantine, up to 256 MB, and shadow memory).
sub sanitized { $SANITIZE ? 1 : 0 }

# $t->port - a free TCP port on 127.0.0.1, never the same twice per process.
sub port {
    for (1 .. 100) {
        my $sock = IO::Socket::INET->new(
            LocalAddr => '127.0.0.1',
            LocalPort => 0,
            Proto     => 'tcp',
        ) or croak "cannot bind a free port: $!";
        my $port = $sock->sockport;
        close $sock;
        next if $USED_PORTS{$port}++;
        return $port;
    }
    croak 'no unused free port found';
}

# ---------------------------------------------------------------------------
# Backends

# $t->start_backends($n, delay_ms => 0) - starts $n backends, returns ports.
sub start_backends {
    my ($self, $n, %opt) = @_;
    my @ports = map { $self->port } 1 .. $n;
    $self->_spawn_backend($_, %opt) for @ports;
    $self->_wait_backend($_) for @ports;
    return wantarray ? @ports : $ports[0];
}

# $t->start_backend($key, delay_ms => 0) - (re)starts a backend on $key (a
# port, or "ADDR:PORT" as returned by start_backend_at); returns the key.
sub start_backend {
    my ($self, $key, %opt) = @_;
    return $self->start_backend_at(_split_key($key), %opt);
}

# $t->start_backend_at($host, $port, delay_ms => 0) - starts a backend on
# $host:$port, any address of 127.0.0.0/8; $port defaults to a fresh
# $t->port.  Backends on different addresses may share a port, as the
# servers one DNS name resolves to do.  Returns the backend's key: $port for
# 127.0.0.1, "$host:$port" otherwise.
sub start_backend_at {
    my ($self, $host, $port, %opt) = @_;
    croak 'start_backend_at: no host' unless defined $host && length $host;
    $port //= $self->port;
    my $key = _backend_key($host, $port);
    croak "backend on $host:$port is already running" if $self->{backends}{$key};
    $self->_spawn_backend($key, %opt);
    $self->_wait_backend($key);
    return $key;
}

# $t->stop_backend($key) - stops it; afterwards its port refuses connections.
sub stop_backend {
    my ($self, $key) = @_;
    $key = _backend_key(_split_key($key));
    my $b = delete $self->{backends}{$key} or croak "no backend on $key";
    _terminate($b->{pid}, 'TERM', 10);
    return;
}

# $t->backend_ports - ports of the running backends on 127.0.0.1.
sub backend_ports {
    sort { $a <=> $b } grep { /^\d+$/ } keys %{ $_[0]{backends} };
}

# $t->backend_keys - keys of all running backends, by address then port.
sub backend_keys {
    my ($self) = @_;
    return map { $_->[0] }
        sort { $a->[1] cmp $b->[1] || $a->[2] <=> $b->[2] }
        map { my ($h, $p) = _split_key($_); [ $_, inet_aton($h) // $h, $p ] }
        keys %{ $self->{backends} };
}

# "ADDR:PORT" -> (ADDR, PORT); a bare port is on 127.0.0.1.
sub _split_key {
    my ($key) = @_;
    croak 'no backend port given' unless defined $key;
    return ($1, $2) if $key =~ /^(.+):(\d+)$/;
    croak "not a port or ADDR:PORT: $key" unless $key =~ /^\d+$/;
    return ($LOCALHOST, $key);
}

sub _backend_key {
    my ($host, $port) = @_;
    return $host eq $LOCALHOST ? $port + 0 : "$host:$port";
}

# Log and pid file names: "backend-PORT" or "backend-ADDR-PORT".
sub _backend_file {
    my ($self, $key, $dir, $ext) = @_;
    (my $tag = $key) =~ tr/:/-/;
    return $self->path("$dir/backend-$tag.$ext");
}

# _spawn($log, @command) - forks and execs @command with stdin from
# /dev/null and stdout and stderr appended to $log; returns the child's pid.
sub _spawn {
    my ($log, @command) = @_;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', File::Spec->devnull;
        open STDOUT, '>>', $log;
        open STDERR, '>&', \*STDOUT;
        { exec @command };
        print STDERR "exec $command[0]: $!\n";
        POSIX::_exit(127);
    }
    return $pid;
}

sub _spawn_backend {
    my ($self, $key, %opt) = @_;
    my ($host, $port) = _split_key($key);
    my $delay = $opt{delay_ms} // 0;
    my $log   = $self->_backend_file($key, 'logs', 'log');
    my $ppid  = $$;

    my $pid = _spawn($log, $^X, $BACKEND, '--host', $host, '--port', $port,
        '--delay-ms', $delay, '--pidfile', $self->_backend_file($key, 'tmp', 'pid'),
        '--watch-pid', $ppid);
    $self->{backends}{$key} = { pid => $pid, host => $host, port => $port,
                                delay_ms => $delay };
}

sub _wait_backend {
    my ($self, $key) = @_;
    my $b = $self->{backends}{$key};
    my $deadline = time + 15;

    until (_port_open($b->{port}, $b->{host})) {
        if (waitpid($b->{pid}, WNOHANG) == $b->{pid}) {
            delete $self->{backends}{$key};
            croak "backend on $b->{host}:$b->{port} exited (status $?): "
                . _slurp($self->_backend_file($key, 'logs', 'log'));
        }
        croak "backend on $b->{host}:$b->{port} did not start within 15 s"
            if time > $deadline;
        sleep 0.02;
    }
}

# $t->start_mock_replicas($n, @options) - $n mock inference replicas
# (bench/sim/mock_backend.py: OpenAI endpoints, stored responses), one
# process each so that one can be stopped; @options are the mock's own.
# Returns their ports.
sub start_mock_replicas {
    my ($self, $n, @options) = @_;
    my @ports = map { $self->port } 1 .. $n;

    for my $port (@ports) {
        $self->{mocks}{$port} = _spawn($self->path("logs/mock-$port.log"),
            $PYTHON, $MOCK, '--ports', $port, '--name-prefix', "replica-$port",
            @options);
    }

    my $deadline = time + 30 * $SLOW;
    for my $port (@ports) {
        until (_port_open($port, $LOCALHOST)) {
            croak "mock replica on port $port did not start: "
                . _slurp($self->path("logs/mock-$port.log"))
                if time > $deadline
                   || waitpid($self->{mocks}{$port}, WNOHANG) == $self->{mocks}{$port};
            sleep 0.05;
        }
    }
    return wantarray ? @ports : $ports[0];
}

# $t->stop_mock_replica($port) - stops it; its port refuses connections.
sub stop_mock_replica {
    my ($self, $port) = @_;
    my $pid = delete $self->{mocks}{$port} or croak "no mock replica on $port";
    _terminate($pid, 'TERM', 10);
    return;
}

# AffinityTest::redis_server() - the redis-server on PATH (or in /usr/bin,
# /usr/sbin), or undef when it is not installed.
sub redis_server {
    return (grep { -x } map { "$_/redis-server" }
            split /:/, ($ENV{PATH} // '') . ':/usr/bin:/usr/sbin')[0];
}

# $t->start_redis($port, @options) - a redis-server on 127.0.0.1:$port that
# keeps nothing on disk, until the end of the test (service "redis"), with
# more redis-server @options (a --requirepass is remembered for
# redis_send()).
sub start_redis {
    my ($self, $port, @options) = @_;
    my $server = redis_server() or croak 'redis-server not installed';
    for my $i (0 .. $#options - 1) {
        $REDIS_PASSWORD{$port} = $options[$i + 1]
            if $options[$i] eq '--requirepass';
    }
    return $self->start_service(redis => $port, $server, '--port', $port,
        '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', @options);
}

# AffinityTest::redis_send($port, @args) - a new connection to the
# redis-server on 127.0.0.1:$port that sent it the command @args (after
# AUTH, when start_redis() gave it a password); the reply is the caller's
# to read.
sub redis_send {
    my ($port, @args) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => $LOCALHOST, PeerPort => $port,
                                  Timeout => 5 * $SLOW)
        or croak "redis on $port: $!";
    my $command = sub {
        print {$s} '*' . @_ . "\r\n"
            . join('', map { '$' . length($_) . "\r\n$_\r\n" } @_);
    };
    if (defined $REDIS_PASSWORD{$port}) {
        $command->('AUTH', $REDIS_PASSWORD{$port});
        my $ok = <$s> // '';
        croak "AUTH on $port: $ok" unless $ok =~ /^\+OK/;
    }
    $command->(@args);
    return $s;
}

# AffinityTest::redis_command($port, @args) - the first line of the reply
# of the redis-server on 127.0.0.1:$port to the command @args, '' if none.
sub redis_command {
    my $s = redis_send(@_);
    my $reply = <$s>;
    close $s;
    return $reply // '';
}

# AffinityTest::redis_clients($port) - the clients connected to the
# redis-server on 127.0.0.1:$port other than this one, each a hash of its
# CLIENT LIST fields (cmd: the last command it sent, in lower case).
sub redis_clients {
    my ($port) = @_;
    my $s = redis_send($port, 'CLIENT', 'LIST');
    my $head = <$s> // '';
    croak "CLIENT LIST: $head" unless $head =~ /^\$(\d+)\r\n$/;
    my ($len, $list) = ($1, '');
    while (length $list < $len) {
        my $n = read($s, $list, $len - length $list, length $list);
        croak "CLIENT LIST: short reply" unless $n;
    }
    close $s;
    my @clients;
    for my $line (split /\n/, $list) {
        my %fields = map { /^([^=]+)=(.*)$/ ? ($1, $2) : () } split ' ', $line;
        push @clients, \%fields unless ($fields{cmd} // '') =~ /^client/;
    }
    return @clients;
}

# $t->start_service($name, $port, @command) - runs @command (a server that
# listens on 127.0.0.1:$port, e.g. redis-server) until stop_service or the
# end of the test; its output goes to logs/$name.log.
sub start_service {
    my ($self, $name, $port, @command) = @_;
    croak "service $name is already running" if $self->{services}{$name};
    my $log = $self->path("logs/$name.log");
    my $pid = _spawn($log, @command);
    $self->{services}{$name} = $pid;
    my $deadline = time + 15 * $SLOW;
    until (_port_open($port, $LOCALHOST)) {
        croak "$name did not start: " . _slurp($log)
            if time > $deadline || waitpid($pid, WNOHANG) == $pid;
        sleep 0.02;
    }
    return $pid;
}

# $t->stop_service($name, $signal = 'TERM') - stops it and waits for it.
sub stop_service {
    my ($self, $name, $signal) = @_;
    my $pid = delete $self->{services}{$name} or croak "no service $name";
    _terminate($pid, $signal // 'TERM', 10);
    return;
}

# $t->backend_stats($key) - { port, inflight, max_inflight, requests, held },
# tags while tagged requests are in flight (see backend_tags), and addr for
# a backend not on 127.0.0.1.
sub backend_stats {
    my ($self, $key) = @_;
    my $res = $self->http(GET => '/__stats', port => $key);
    croak "GET /__stats on backend $key failed: "
        . ($res->{error} // "status $res->{status}")
        unless $res->{status} == 200;
    return { $res->{body} =~ /(\w+)=(\S+)/g };
}

# $t->backend_reset($key) - zero max_inflight and requests of a backend.
sub backend_reset {
    my ($self, $key) = @_;
    my $res = $self->http(GET => '/__reset', port => $key);
    croak "GET /__reset on backend $key failed" unless $res->{status} == 200;
    return 1;
}

# $t->backend_tags($key) - the requests in flight at a backend by their
# X-Tag header: { tag => count }.
sub backend_tags {
    my ($self, $key) = @_;
    my $tags = $self->backend_stats($key)->{tags} // '';
    return { map { /^(.+):(\d+)$/ ? ($1 => $2) : () } split /,/, $tags };
}

# $t->backend_release($key) - answers the requests a backend holds (sent
# with X-Hold); returns how many.
sub backend_release {
    my ($self, $key) = @_;
    my $res = $self->http(GET => '/__release', port => $key);
    croak "GET /__release on backend $key failed"
        unless $res->{status} == 200 && $res->{body} =~ /^released (\d+)/;
    return $1;
}

# ---------------------------------------------------------------------------
# DNS

# $t->start_dns({ ttl => 1, port => free }, NAME => [ADDR, ...] | ADDR, ...)
# Starts the mock DNS server (t/dns.pl) on a UDP port of 127.0.0.1 serving
# these A records (the leading hash of options is optional); returns its
# port, for "resolver 127.0.0.1:PORT".  One DNS server per test object at a
# time; pass port => $t->dns_port (taken before stop_dns) to start it again
# where nginx looks for it.
sub start_dns {
    my ($self, @args) = @_;
    my %opt = ref $args[0] eq 'HASH' ? %{ shift @args } : ();
    croak 'the DNS server is already running' if $self->{dns};
    my $ttl = $opt{ttl} // 1;
    croak "bad ttl: $ttl" unless $ttl =~ /^\d+$/;

    my $records = $self->path('dns-records');
    $self->_write_records($records, @args);

    my $port = $opt{port} // $self->_udp_port;
    my $log  = $self->path('logs/dns.log');
    my $pidfile = $self->path('tmp/dns.pid');
    my $ppid = $$;
    unlink $pidfile;

    my $pid = _spawn($log, $^X, $DNS, '--port', $port, '--records', $records,
        '--ttl', $ttl, '--pidfile', $pidfile, '--watch-pid', $ppid);
    $self->{dns} = { pid => $pid, port => $port, records => $records };

    # dns.pl writes its pid file once the socket is bound.
    my $deadline = time + 15;
    until (_slurp($pidfile) =~ /^\s*$pid\s*$/) {
        if (waitpid($pid, WNOHANG) == $pid) {
            delete $self->{dns};
            croak "DNS server on port $port exited (status $?): " . _slurp($log);
        }
        croak "DNS server on port $port did not start within 15 s" if time > $deadline;
        sleep 0.02;
    }
    return $port;
}

# $t->set_dns(NAME => [ADDR, ...] | ADDR, ...) - replaces all records at
# once (an empty list [] leaves a name that exists but has no addresses; a
# name left out gets NXDOMAIN).  The next query sees the new records.
sub set_dns {
    my ($self, @records) = @_;
    my $dns = $self->{dns} or croak 'the DNS server is not running (start_dns)';
    $self->_write_records($dns->{records}, @records);
    return 1;
}

# $t->stop_dns - stops the DNS server; queries then go unanswered.
sub stop_dns {
    my ($self) = @_;
    my $dns = delete $self->{dns} or croak 'the DNS server is not running';
    _terminate($dns->{pid}, 'TERM', 10);
    return;
}

# $t->dns_port - UDP port of the running DNS server, undef if none.
sub dns_port { $_[0]{dns} ? $_[0]{dns}{port} : undef }

# $t->dns_query($name, type => 'A' | 'AAAA' | number, port => dns_port,
#     timeout => 2)
# Asks a DNS server over UDP.  Returns { rcode => 'NOERROR' | 'NXDOMAIN' | ..,
# flags, question => NAME, answers => count, addrs => [A record addresses],
# ttls => [their TTLs] }, or { rcode => undef, error => ".." }.
sub dns_query {
    my ($self, $name, %opt) = @_;
    my %type = (A => 1, AAAA => 28, ANY => 255);
    my $type = $opt{type} // 'A';
    $type = $type{ uc $type } // croak "unknown type $type" unless $type =~ /^\d+$/;
    my $port = $opt{port} // $self->dns_port // croak 'no DNS port';

    my $sock = IO::Socket::INET->new(PeerAddr => $LOCALHOST, PeerPort => $port,
        Proto => 'udp') or return { rcode => undef, error => "socket: $!" };
    my $id = int rand 65536;
    my $qname = join '', map { pack 'C/a*', $_ } grep { length } split /\./, $name;
    send($sock, pack('n n n n n n', $id, 0x0100, 1, 0, 0, 0) . $qname
        . "\0" . pack('n n', $type, 1), 0) or return { rcode => undef, error => "send: $!" };

    my $deadline = time + ($opt{timeout} // 2);
    my $reply;
    while (1) {
        my $left = $deadline - time;
        return { rcode => undef, error => 'timeout' }
            if $left <= 0 || !IO::Select->new($sock)->can_read($left);
        defined recv($sock, $reply, 65535, 0)
            or return { rcode => undef, error => "recv: $!" };
        last if length $reply >= 12 && unpack('n', $reply) == $id;
    }
    return _parse_dns_reply($reply);
}

sub _parse_dns_reply {
    my ($reply) = @_;
    my ($flags, $qd, $an) = unpack 'x2 n n n', $reply;
    my @rcodes = qw(NOERROR FORMERR SERVFAIL NXDOMAIN NOTIMP REFUSED);
    my %res = (flags => $flags, rcode => $rcodes[$flags & 0xf] // $flags & 0xf,
               answers => $an, addrs => [], ttls => []);

    # Skips a (possibly compressed) name at $$pos, returns it dotted.
    my $name = sub {
        my ($pos) = @_;
        my @labels;
        while ($$pos < length $reply) {
            my $len = ord substr($reply, $$pos, 1);
            if ($len >= 0xc0) { $$pos += 2; push @labels, '*'; last }
            $$pos += 1 + $len;
            last if $len == 0;
            push @labels, substr($reply, $$pos - $len, $len);
        }
        return join '.', @labels;
    };

    my $pos = 12;
    for (1 .. $qd) {
        $res{question} = $name->(\$pos);
        $pos += 4;
    }
    for (1 .. $an) {
        $name->(\$pos);
        last if $pos + 10 > length $reply;
        my ($type, $class, $ttl, $len) = unpack 'n n N n', substr($reply, $pos, 10);
        $pos += 10;
        if ($type == 1 && $len == 4) {
            push @{ $res{addrs} }, join '.', unpack 'C4', substr($reply, $pos, 4);
            push @{ $res{ttls} }, $ttl;
        }
        $pos += $len;
    }
    return \%res;
}

# Writes the records file atomically: a temporary file renamed over it.
sub _write_records {
    my ($self, $file, @records) = @_;
    croak 'odd number of arguments: NAME => [ADDR, ...] pairs expected' if @records % 2;
    my %records = @records;

    my $text = '';
    for my $name (sort keys %records) {
        croak "bad DNS name: '$name'" unless $name =~ /^[A-Za-z0-9_.-]+$/;
        my $addrs = $records{$name};
        my @addrs = ref $addrs eq 'ARRAY' ? @$addrs : defined $addrs ? ($addrs) : ();
        for my $addr (@addrs) {
            my @octets = ($addr // '') =~ /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
            croak "bad IPv4 address for $name: " . ($addr // 'undef')
                if !@octets || grep { $_ > 255 } @octets;
        }
        $text .= join(' ', $name, @addrs) . "\n";
    }

    my $tmp = "$file.tmp";
    open my $fh, '>', $tmp or croak "write $tmp: $!";
    print {$fh} $text;
    close $fh or croak "write $tmp: $!";
    rename $tmp, $file or croak "rename $tmp to $file: $!";
}

# A port from $t->port that is also free for UDP on 127.0.0.1.
sub _udp_port {
    my ($self) = @_;
    for (1 .. 20) {
        my $port = $self->port;
        my $sock = IO::Socket::INET->new(LocalAddr => $LOCALHOST, LocalPort => $port,
            Proto => 'udp') or next;
        close $sock;
        return $port;
    }
    croak 'no port free for UDP found';
}

# ---------------------------------------------------------------------------
# nginx

# $t->write_conf($http_body, no_module => 0, workers => 4,
#     worker_connections => 1024, access_log_format => undef, main_conf => '',
#     events_conf => '')
# Writes <dir>/nginx.conf and returns its path.
sub write_conf {
    my ($self, $http_body, %opt) = @_;
    my $no_module = $opt{no_module} // $self->{no_module};
    $self->{conf_workers} = $opt{workers} // $self->{workers};

    my %p = map { $_ => '"' . $self->path($_) . '"' }
        qw(logs/error.log logs/nginx.pid logs/access.log
           tmp/client_body tmp/proxy tmp/fastcgi tmp/uwsgi tmp/scgi);
    my $load = $no_module ? '' : qq{load_module "$self->{module}";\n};
    my $format = defined $opt{access_log_format} ? " $opt{access_log_format}" : '';
    my $main = $opt{main_conf} // '';
    my $wc   = $opt{worker_connections} // 1024;
    my $events = $opt{events_conf} // '';

    my $conf = <<"EOF";
${load}worker_processes $self->{conf_workers};
error_log $p{'logs/error.log'} info;
pid $p{'logs/nginx.pid'};
$main
events {
    worker_connections $wc;
$events
}

http {
    access_log $p{'logs/access.log'}$format;

    client_body_temp_path $p{'tmp/client_body'};
    proxy_temp_path $p{'tmp/proxy'};
    fastcgi_temp_path $p{'tmp/fastcgi'};
    uwsgi_temp_path $p{'tmp/uwsgi'};
    scgi_temp_path $p{'tmp/scgi'};

$http_body
}
EOF

    my $file = $self->path('nginx.conf');
    open my $fh, '>', $file or croak "write $file: $!";
    print {$fh} $conf;
    close $fh or croak "write $file: $!";
    return $file;
}

# $t->nginx_test - runs "nginx -t", returns (exit code, combined output).
sub nginx_test {
    my ($self) = @_;
    my %env = $self->_nginx_env;
    local @ENV{ keys %env } = values %env;
    return _run($self->_nginx_cmd, '-t');
}

# $t->start_nginx(port => listen_port) - starts nginx, dies with its output
# on failure; waits for the pid file, the workers and the listening port.
sub start_nginx {
    my ($self, %opt) = @_;
    croak 'nginx is already running' if $self->{nginx_pid};
    my $port    = $opt{port} // $self->{listen_port};
    my $pidfile = $self->path('logs/nginx.pid');
    my $out     = $self->path('logs/nginx.out');
    unlink $pidfile;

    my $pid = do {
        my %env = $self->_nginx_env;
        local @ENV{ keys %env } = values %env;
        _spawn($out, $self->_nginx_cmd, '-g', 'daemon off;');
    };
    $self->{nginx_pid} = $pid;

    my $timeout  = 15 * $SLOW;
    my $deadline = time + $timeout;
    my $ready = sub {
        return 0 unless _slurp($pidfile) =~ /^\s*$pid\s*$/;
        return 0 if $port && !_port_open($port);
        my @workers = $self->worker_pids;
        return @workers >= $self->_expected_workers;
    };
    until ($ready->()) {
        if (waitpid($pid, WNOHANG) == $pid) {
            my $status = $?;
            delete $self->{nginx_pid};
            croak "nginx failed to start (exit code " . ($status >> 8) . "):\n" . _slurp($out)
                . "\n--- error.log ---\n" . $self->error_log;
        }
        if (time > $deadline) {
            croak "nginx did not become ready within $timeout s:\n" . _slurp($out)
                . "\n--- error.log ---\n" . $self->error_log;
        }
        sleep 0.02;
    }
    return $pid;
}

# $t->reload_nginx - HUP, then waits until all old workers are gone and the
# new ones are running (15 s timeout, 60 s with a sanitizer build).
sub reload_nginx {
    my ($self) = @_;
    my $master = $self->{nginx_pid} or croak 'nginx is not running';
    my %old = map { $_ => 1 } $self->worker_pids;
    my $log_size = -s $self->path('logs/error.log') // 0;

    kill 'HUP', $master or croak "kill HUP $master: $!";

    my $timeout  = 15 * $SLOW;
    my $deadline = time + $timeout;
    while (1) {
        my @now = $self->worker_pids;
        my @new = grep { !$old{$_} } @now;
        return scalar @new
            if @new >= $self->_expected_workers && !grep { $old{$_} } @now;

        my $fresh = substr($self->error_log, $log_size);
        croak "nginx reload failed:\n$fresh" if $fresh =~ /\[emerg\]/;
        croak "nginx master $master exited during reload" unless kill 0, $master;
        croak "nginx reload did not finish within $timeout s (old: @{[sort keys %old]}, "
            . "now: @now)" if time > $deadline;
        sleep 0.05;
    }
}

# $t->stop_nginx - graceful shutdown (QUIT) and wait for the master to exit.
sub stop_nginx {
    my ($self) = @_;
    my $pid = delete $self->{nginx_pid} or return;
    _terminate($pid, 'QUIT', 15 * $SLOW);
    return;
}

# $t->master_pid - pid of the nginx master process, undef if not running.
sub master_pid { $_[0]{nginx_pid} }

# $t->worker_pids - pids of the current children of the nginx master.
sub worker_pids {
    my ($self) = @_;
    my $master = $self->{nginx_pid} or return;
    return _children_of($master);
}

sub _expected_workers {
    my ($self) = @_;
    my $n = $self->{conf_workers} // $self->{workers};
    return $n =~ /^\d+$/ ? $n : 1;    # "auto": at least one
}

sub _nginx_cmd {
    my ($self) = @_;
    my @cmd = ($self->{nginx}, '-p', $self->{dir} . '/', '-c', $self->path('nginx.conf'));
    push @cmd, '-e', $self->path('logs/error.log') if $self->_nginx_supports_e;
    return @cmd;
}

# "-e" appeared in nginx 1.19.5.
sub _nginx_supports_e { $_[0]->nginx_at_least('1.19.5') }

# $t->nginx_version - version of the nginx binary ("1.22.1"), undef if
# "nginx -v" does not tell.
sub nginx_version {
    my ($self) = @_;
    $self->{nginx_version} //= do {
        my (undef, $out) = _run($self->{nginx}, '-v');
        $out =~ m{nginx/(\d+\.\d+\.\d+)} ? $1 : '';
    };
    return length $self->{nginx_version} ? $self->{nginx_version} : undef;
}

# $t->nginx_at_least('1.27.3') - whether nginx is that version or newer
# (e.g. "server NAME resolve;" needs 1.27.3); false if the version is unknown.
sub nginx_at_least {
    my ($self, $want) = @_;
    my $have = $self->nginx_version // return 0;
    my $key = sub { sprintf '%03d%03d%03d', map { $_ // 0 } (split /\./, $_[0])[0 .. 2] };
    return $key->($have) ge $key->($want) ? 1 : 0;
}

# $t->error_log - full text of logs/error.log.
sub error_log { $_[0]->_log_text('error.log') }

# $t->access_log - the http{} access log so far (servers without one of
# their own write to it).
sub access_log { $_[0]->_log_text('access.log') }

# The text of logs/$name, or '' when there is none yet.
sub _log_text {
    my ($self, $name) = @_;
    my $file = $self->path("logs/$name");
    return -e $file ? _slurp($file) : '';
}

# $t->log_problems - error.log lines with [alert], [crit], [emerg] or a
# process that exited on a signal.  With a sanitizer build also one line for
# each sanitizer report (the whole report is shown with diag), and the lines
# of error.log and of nginx's own output (logs/nginx.out) that a sanitizer
# or a failed assertion wrote to stderr.
sub log_problems {
    my ($self) = @_;
    my @problems = grep { /\[(?:alert|crit|emerg)\]/ || /exited on signal/ }
        split /\n/, $self->error_log;
    return @problems unless $SANITIZE;
    my $stderr = qr/runtime error:|Sanitizer|^==\d+==|Assertion .* failed/;
    push @problems, grep { /$stderr/ && !/\[(?:alert|crit|emerg)\]/ }
        split /\n/, $self->error_log . "\n" . _slurp($self->path('logs/nginx.out'));
    return (@problems, $self->_sanitizer_problems);
}

# $t->sanitizer_reports - [ file name, text ] of each sanitizer report file
# so far, oldest first (none without AFFINITY_SANITIZE).
sub sanitizer_reports {
    my ($self) = @_;
    return () unless $SANITIZE;
    my $dir = $self->path('sanitizer');
    opendir my $dh, $dir or return ();
    my @files = grep { -f "$dir/$_" } readdir $dh;
    closedir $dh;
    return map { [ $_->[0], _slurp("$dir/$_->[0]") ] }
        sort { $a->[1] <=> $b->[1] || $a->[0] cmp $b->[0] }
        map { [ $_, (stat "$dir/$_")[9] ] } @files;
}

# One line for each report ("sanitizer report asan.1234: ERROR: ..."); each
# report is shown in full with diag the first time it is returned.
sub _sanitizer_problems {
    my ($self) = @_;
    my @problems;
    for my $report ($self->sanitizer_reports) {
        my ($name, $text) = @$report;
        my ($summary) = $text =~ /^(?:==\d+==)?((?:ERROR|WARNING): .*|SUMMARY: .*)$/m;
        ($summary) = $text =~ /^(.*runtime error: .*)$/m unless defined $summary;
        ($summary) = $text =~ /^\s*(\S.*)$/m unless defined $summary;
        push @problems, "sanitizer report $name: " . ($summary // '(empty)');
        Test::More::diag("--- sanitizer report sanitizer/$name ---\n$text")
            unless $self->{sanitizer_seen}{$name}++;
    }
    return @problems;
}

# ---------------------------------------------------------------------------
# HTTP client

# $t->http($method, $path, headers => {..} | [k => v, ..], body => $str,
#     port => listen_port, host => '127.0.0.1', timeout => 30 (60 with a
#     sanitizer build))
# port may also be a backend key "ADDR:PORT", which sets the host too.
# Returns { status, headers => { lc name => value ("\n"-joined if repeated) },
#     set_cookie => [..], body, raw }, or { status => 0, error => ".." }.
sub http {
    my ($self, $method, $path, %opt) = @_;
    my ($res) = $self->parallel(
        [ { %opt, method => $method, path => $path } ],
        timeout => $opt{timeout},
    );
    return $res;
}

# $t->parallel(\@requests, timeout => 30 (60)) - each request is
# { method, path, headers, body, port, host } as for http; all connections
# are opened at once.
# Returns the responses (as from http) in the same order, each with
# first_byte: the seconds from the start to its first byte of response.
sub parallel {
    my ($self, $requests, %opt) = @_;
    my $start = time;
    my $deadline = $start + ($opt{timeout} // $HTTP_TIMEOUT);
    my $rsel = IO::Select->new;
    my $wsel = IO::Select->new;
    my (@slots, %by_fd);

    for my $req (@$requests) {
        my ($host, $port) = ($req->{host} // $LOCALHOST, $req->{port} // $self->{listen_port});
        ($host, $port) = ($1, $2) if $port =~ /^(.+):(\d+)$/;
        my $slot = { out => _build_request($req), in => '' };
        push @slots, $slot;

        my ($sock, $err) = _connect_nb($host, $port);
        if (!$sock) {
            $slot->{res} = { status => 0, error => "connect to $host:$port: $err" };
            next;
        }
        $slot->{sock} = $sock;
        $slot->{connecting} = 1;
        $by_fd{ fileno $sock } = $slot;
        $wsel->add($sock);
    }

    my $finish = sub {
        my ($slot, $error) = @_;
        $rsel->remove($slot->{sock});
        $wsel->remove($slot->{sock});
        delete $by_fd{ fileno $slot->{sock} };
        close delete $slot->{sock};
        $slot->{res} = length $slot->{in}
            ? _parse_response($slot->{in})
            : { status => 0, error => $error // 'connection closed without response' };
        $slot->{res}{first_byte} = $slot->{first} if defined $slot->{first};
    };

    while (%by_fd) {
        my $left = $deadline - time;
        last if $left <= 0;
        my ($readable, $writable) = IO::Select->select($rsel, $wsel, undef, $left);

        for my $sock (@{ $writable || [] }) {
            my $slot = $by_fd{ fileno $sock } or next;
            if (delete $slot->{connecting}) {
                my $errno = unpack 'i', getsockopt($sock, SOL_SOCKET, SO_ERROR);
                if ($errno) {
                    local $! = $errno;
                    $finish->($slot, "connect: $!");
                    next;
                }
            }
            my $n = syswrite($sock, $slot->{out});
            if (!defined $n) {
                next if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
                $slot->{out} = '';    # peer closed early: read what it sent
            }
            else {
                substr($slot->{out}, 0, $n, '');
            }
            if (!length $slot->{out}) {
                $wsel->remove($sock);
                $rsel->add($sock);
            }
        }

        for my $sock (@{ $readable || [] }) {
            my $slot = $by_fd{ fileno $sock } or next;
            my $n = sysread($sock, $slot->{in}, 65536, length $slot->{in});
            $slot->{first} //= time - $start if $n;
            if (!defined $n) {
                next if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
                $finish->($slot, "read: $!");
            }
            elsif ($n == 0) {
                $finish->($slot);
            }
        }
    }

    for my $slot (grep { $_->{sock} } @slots) {
        close delete $slot->{sock};
        $slot->{res} = { status => 0, error => 'timeout', raw => $slot->{in} };
    }
    return map { $_->{res} } @slots;
}

sub _connect_nb {
    my ($host, $port) = @_;
    socket(my $sock, PF_INET, SOCK_STREAM, IPPROTO_TCP) or return (undef, "socket: $!");
    my $flags = fcntl($sock, F_GETFL, 0);
    fcntl($sock, F_SETFL, $flags | O_NONBLOCK) or return (undef, "fcntl: $!");
    my $ip   = inet_aton($host) // return (undef, "bad address $host");
    my $addr = pack_sockaddr_in($port, $ip);
    return ($sock) if connect($sock, $addr) || $! == EINPROGRESS;
    return (undef, "$!");
}

sub _build_request {
    my ($req) = @_;
    my $method = $req->{method} // 'GET';
    my $path   = $req->{path} // '/';
    my $h      = $req->{headers} // [];
    my @pairs  = ref $h eq 'HASH' ? map { $_ => $h->{$_} } sort keys %$h : @$h;

    my (%have, @lines);
    while (my ($name, $value) = splice @pairs, 0, 2) {
        $have{ lc $name } = 1;
        push @lines, "$name: $value";
    }
    my $body = $req->{body};

    # Caller-supplied headers win over the defaults.
    unshift @lines, 'Host: localhost' unless $have{host};
    push @lines, 'Connection: close' unless $have{connection};
    push @lines, 'Content-Length: ' . length($body)
        if defined $body && !$have{'content-length'} && !$have{'transfer-encoding'};

    return join("\r\n", "$method $path HTTP/1.1", @lines, '', '') . ($body // '');
}

sub _parse_response {
    my ($raw) = @_;
    my $end = index $raw, "\r\n\r\n";
    return { status => 0, error => 'incomplete response header', raw => $raw } if $end < 0;

    my ($status_line, @lines) = split /\r\n/, substr($raw, 0, $end);
    my ($status) = $status_line =~ m{^HTTP/\d\.\d\s+(\d{3})}
        or return { status => 0, error => "bad status line: $status_line", raw => $raw };

    my (%headers, @cookies);
    for my $line (@lines) {
        my ($name, $value) = $line =~ /^([^:]+?)\s*:\s*(.*?)\s*$/ or next;
        $name = lc $name;
        $headers{$name} = exists $headers{$name} ? "$headers{$name}\n$value" : $value;
        push @cookies, $value if $name eq 'set-cookie';
    }

    my $body = substr $raw, $end + 4;
    if (($headers{'transfer-encoding'} // '') =~ /chunked/i) {
        $body = _decode_chunked($body);
    }
    elsif (defined $headers{'content-length'} && $headers{'content-length'} =~ /^(\d+)$/) {
        $body = substr $body, 0, $1;
    }

    return {
        status     => $status + 0,
        headers    => \%headers,
        set_cookie => \@cookies,
        body       => $body,
        raw        => $raw,
    };
}

sub _decode_chunked {
    my ($data) = @_;
    my $body = '';
    while ($data =~ s/\A([0-9a-fA-F]+)[^\r\n]*\r?\n//) {
        my $size = hex $1;
        last if $size == 0;
        $body .= substr $data, 0, $size, '';
        $data =~ s/\A\r?\n//;
    }
    return $body;
}

# ---------------------------------------------------------------------------
# Process helpers

sub _port_open {
    my ($port, $host) = @_;
    my $sock = IO::Socket::INET->new(
        PeerAddr => $host // $LOCALHOST,
        PeerPort => $port,
        Proto    => 'tcp',
        Timeout  => 1,
    ) or return 0;
    close $sock;
    return 1;
}

# Runs a command without a shell; returns (exit code, stdout+stderr).
sub run_command { return _run(@_) }

sub _run {
    my (@cmd) = @_;
    my $pid = open(my $fh, '-|') // croak "fork: $!";
    if ($pid == 0) {
        open STDERR, '>&', \*STDOUT;
        exec @cmd or print "exec $cmd[0]: $!\n";
        POSIX::_exit(127);
    }
    my $out = do { local $/; <$fh> } // '';
    close $fh;
    return ($? >> 8, $out);
}

# Sends $signal to our child $pid and reaps it, escalating to KILL after
# $timeout seconds.
sub _terminate {
    my ($pid, $signal, $timeout) = @_;
    kill $signal, $pid;
    my $deadline = time + $timeout;
    while (1) {
        my $r = waitpid($pid, WNOHANG);
        return if $r == $pid || $r == -1;
        if (time > $deadline) {
            kill 'KILL', $pid;
            waitpid($pid, 0);
            return;
        }
        sleep 0.02;
    }
}

sub _slurp {
    my ($file) = @_;
    open my $fh, '<', $file or return '';
    local $/;
    return scalar <$fh> // '';
}

sub _cleanup {
    my ($self) = @_;
    return if $self->{cleaned} || $self->{owner} != $$;
    $self->{cleaned} = 1;

    if (my $master = delete $self->{nginx_pid}) {
        my @workers = _children_of($master);
        _terminate($master, 'TERM', 10 * $SLOW);
        kill 'KILL', grep { kill 0, $_ } @workers;
    }
    for my $key (keys %{ $self->{backends} }) {
        my $b = delete $self->{backends}{$key};
        kill 'TERM', $b->{pid};
        push @{ $self->{stopping} }, $b->{pid};
    }
    for my $name (keys %{ $self->{services} // {} }) {
        my $pid = delete $self->{services}{$name};
        kill 'TERM', $pid;
        push @{ $self->{stopping} }, $pid;
    }
    for my $port (keys %{ $self->{mocks} // {} }) {
        my $pid = delete $self->{mocks}{$port};
        kill 'TERM', $pid;
        push @{ $self->{stopping} }, $pid;
    }
    if (my $dns = delete $self->{dns}) {
        kill 'TERM', $dns->{pid};
        push @{ $self->{stopping} }, $dns->{pid};
    }
    _terminate($_, 'TERM', 10) for @{ delete $self->{stopping} // [] };

    $self->_check_sanitizer_reports;
}

# Fails a test if there are sanitizer reports and the test passes so far
# (it did not check log_problems, or not after the report was written).
# Reports not shown yet are shown in any case.
sub _check_sanitizer_reports {
    my ($self) = @_;
    return unless $SANITIZE;
    my @problems = $self->_sanitizer_problems;
    return unless @problems && Test::More->builder->is_passing;
    Test::More::ok(0, 'no sanitizer reports')
        or Test::More::diag(join "\n", @problems);
}

# The sanitizer runtime to preload into nginx: the libasan the module is
# linked against, else the compiler's.
sub _sanitizer_preload {
    my ($self) = @_;
    return $ENV{AFFINITY_SANITIZE_PRELOAD} if length($ENV{AFFINITY_SANITIZE_PRELOAD} // '');
    my $module = $self->{no_module} ? undef : $self->{module};
    if (defined $module) {
        my (undef, $out) = _run('ldd', $module);
        return $1 if $out =~ m{^\s*libasan\.so\S*\s+=>\s+(/\S+)}m;
        Test::More::BAIL_OUT("AFFINITY_SANITIZE is set, but $module is not linked "
            . 'against libasan (build it with scripts/build-module.sh --sanitize)');
    }
    my (undef, $lib) = _run($ENV{CC} // 'gcc', '-print-file-name=libasan.so');
    chomp $lib;
    Test::More::BAIL_OUT('AFFINITY_SANITIZE is set, but libasan was not found '
            . '(set AFFINITY_SANITIZE_PRELOAD)')
        unless $lib =~ m{^/} && -e $lib;
    return $lib;
}

# Environment for nginx: the sanitizer runtime and its options.
sub _nginx_env {
    my ($self) = @_;
    return () unless $SANITIZE;
    my $dir = $self->path('sanitizer');
    # Options of the caller first: the ones here win where both set one.
    my $keep = sub {
        my ($name) = @_;
        return grep { length && !/^log_path=/ } split /:/, $ENV{$name} // '';
    };
    return (
        LD_PRELOAD   => join(' ', $self->{sanitizer_preload},
                             grep { length } $ENV{LD_PRELOAD} // ''),
        ASAN_OPTIONS => join(':', $keep->('ASAN_OPTIONS'), 'detect_leaks=0',
                             'halt_on_error=1', "log_path=$dir/asan"),
        UBSAN_OPTIONS => join(':', $keep->('UBSAN_OPTIONS'), 'print_stacktrace=1',
                              'halt_on_error=1', "log_path=$dir/ubsan"),
    );
}

sub _children_of {
    my ($pid) = @_;
    my (undef, $out) = _run('ps', '-o', 'pid=', '--ppid', $pid);
    return map { /(\d+)/ ? $1 : () } split /\n/, $out;
}

sub DESTROY {
    my ($self) = @_;
    local ($., $@, $!, $^E, $?);
    $self->_cleanup;
}

1;
