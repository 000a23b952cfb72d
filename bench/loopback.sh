# shellcheck shell=bash
# The loopback fleet of the nginx benchmarks (bench-throughput.sh,
# bench-instructions.sh): four backends that answer "return 200" from
# inside the nginx under test, on the four ports after the front one.
#
#   . "$(dirname "$0")/loopback.sh"        once port is set
#
# Sets:
#   b           the backends' ports
#   servers     their "server" lines, for an upstream block
# backends_server [DIRECTIVE...]: the server block that plays them, with
# the directives given (an access_log, say).

b=($((port + 1)) $((port + 2)) $((port + 3)) $((port + 4)))
# shellcheck disable=SC2034  # for the scripts that source this
servers="server 127.0.0.1:${b[0]}; server 127.0.0.1:${b[1]};
        server 127.0.0.1:${b[2]}; server 127.0.0.1:${b[3]};"

backends_server() {
    cat <<CONF
    server {
        listen 127.0.0.1:${b[0]} reuseport; listen 127.0.0.1:${b[1]};
        listen 127.0.0.1:${b[2]}; listen 127.0.0.1:${b[3]};
        $*
        location / { return 200 "ok\n"; }
    }
CONF
}
