# ngx_http_upstream_affinity_module
#
#   make                 install missing Debian packages, build the module
#                        into build/ngx_http_upstream_affinity_module.so
#   make NGINX_SRC=dir   build against another nginx source tree
#   make test            unit tests (also under ASan+UBSan), tests of the
#                        simulated fleet, the fuzzing corpus replayed, the
#                        e2e tests with the module as built and with it
#                        built with ASan+UBSan, and the Debian package
#                        installed, used and purged (test-deb)
#   make test-asan       the e2e tests against the module built with
#                        ASan+UBSan (build/asan/)
#   make fuzz            libFuzzer over every parser of client input, each
#                        target FUZZ_SECONDS (default 180); crashes are kept
#                        in fuzz/corpus/ (fuzz/README.md)
#   make fuzz-replay     every committed fuzzing input once, through the
#                        sanitizer build (part of make test)
#   make demo            a mock LLM fleet behind nginx with the module: where
#                        requests go, hit ratios per policy, a chat client
#   make bench-quick     routing under cache pressure, in short: the tight
#                        fleet profile, every workload but long-mix, with
#                        and without session ids, 1 seed, short slices, the
#                        module's default policies, hash consistent,
#                        least_conn, the offline oracle and its choices
#                        replayed through nginx (about 8 min on 2 cores)
#   make bench           everything: microbenchmarks, throughput against
#                        hash consistent, and the full comparison (tight and
#                        roomy profiles, every workload, with and without
#                        session ids, 3 seeds, every main policy): takes
#                        hours, about 9 on 2 cores
#   make bench-trace     the whole Mooncake trace, roomy profile, sessions
#                        on, every main policy
#   make bench-levels    prefix_affinity's level schedules on the trace
#   make bench-throughput
#                        requests per second through nginx on loopback,
#                        the module against nginx's own hash consistent
#                        (part of make bench)
#   make bench-instructions
#                        instructions per request under callgrind, the
#                        module against nginx's own hash consistent, into
#                        build/bench/instructions.md; with
#                        AFFINITY_MODULE_BASE=other.so, against another
#                        build of the module too (under a minute)
#   make bench-micro     the core's microbenchmarks (Google Benchmark), into
#                        build/bench/micro.txt (part of make bench)
#   make bench-faults    fault and soak run: reloads, killed workers, dead
#                        backends and bad bodies under load (FAULT_SECONDS,
#                        default 300; FAULT_SHORT=1 for 60 s), then the
#                        store's faults (bench-store-faults)
#   make bench-store-faults
#                        two instances sharing a redis-server that is
#                        killed, stopped, demoted to a read-only replica
#                        and replaced by junk under load, three runs:
#                        failures, crashes, what was lost, how fast the
#                        instances agree again (about 12 min)
#   make bench-instances 1, 2 and 4 instances of the module, on their own
#                        and sharing a store, on quick slices
#
#                        Every bench* target writes its results into
#                        build/bench/<name>, which git ignores; with
#                        RECORD=1 (make bench-quick RECORD=1) it updates
#                        the committed result in bench/results/<name>
#                        instead (bench/results/README.md lists them).
#                        Each result is stamped with the command that
#                        produced it, the commit, the module's version
#                        and the date (bench/stamp.py).
#   make test-matrix     e2e tests against several nginx versions
#   make install         module and load_module snippet, as Debian lays out
#                        (stripped; its debug symbols in a separate file)
#   make deb             the Debian package libnginx-mod-http-upstream-affinity
#                        for the system nginx, into build/deb/
#   make test-deb        install that package into the system nginx, check
#                        it routes, and purge it (part of make test)
#   make image           an nginx container image with the module (mmdebstrap
#                        base, buildah), built and smoke-tested
#   make version         print the module's version
#   make clean

NGINX_SRC ?=
NGINX_BIN ?= /usr/sbin/nginx
BUILD     := build
MODULE    := $(BUILD)/ngx_http_upstream_affinity_module.so
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
# Debian's interpreter, where python3-matplotlib is installed
PYTHON    ?= /usr/bin/python3

.PHONY: all deps module module-asan unit unit-asan pytests e2e test-asan \
        fuzz fuzz-replay test demo \
        bench bench-quick bench-levels bench-trace bench-throughput \
        bench-instructions bench-micro bench-faults bench-instances \
        bench-store-faults clean

all: module

deps:
	@sh scripts/install-deps.sh

module: deps
	@scripts/build-module.sh $(NGINX_SRC)

# GoogleTest suites of the C++ core, through ctest; once plain and once
# with AddressSanitizer and UndefinedBehaviorSanitizer.
unit: deps
	@cmake -S t/unit -B $(BUILD)/unit -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    > /dev/null
	@cmake --build $(BUILD)/unit -j $(JOBS)
	@cd $(BUILD)/unit && ctest --output-on-failure

unit-asan: deps
	@cmake -S t/unit -B $(BUILD)/unit-asan -DCMAKE_BUILD_TYPE=Debug \
	    -DAFFINITY_SANITIZE=ON > /dev/null
	@cmake --build $(BUILD)/unit-asan -j $(JOBS)
	@cd $(BUILD)/unit-asan && ctest --output-on-failure

# End-to-end tests: real nginx with the module, real backends on loopback.
e2e: module
	@NGINX_BIN=$(NGINX_BIN) AFFINITY_MODULE=$(CURDIR)/$(MODULE) \
	    prove -j 2 t/

# The module with AddressSanitizer and UndefinedBehaviorSanitizer and the
# core's assertions, into build/asan/ (its own nginx tree), and the e2e
# tests against it: any sanitizer report fails the test.
module-asan: deps
	@scripts/build-module.sh --sanitize $(NGINX_SRC)

test-asan: module-asan
	@NGINX_BIN=$(NGINX_BIN) AFFINITY_SANITIZE=1 \
	    AFFINITY_MODULE=$(CURDIR)/$(BUILD)/asan/ngx_http_upstream_affinity_module.so \
	    prove -j 2 t/

# The simulated fleet: mock replicas, trace replay and offline bounds.
pytests: deps
	@$(PYTHON) -m unittest discover -s t/sim -t .

# Fuzzing of the core's parsers of client input (clang, libFuzzer,
# ASan+UBSan, assertions live).
FUZZ_SECONDS ?= 180

fuzz: deps
	@FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh run

fuzz-replay: deps
	@fuzz/run.sh replay

test: unit unit-asan fuzz-replay pytests e2e test-asan test-deb

# Where the benchmarks write (bench/stamp.py): build/bench, which git
# ignores, or with RECORD=1 the committed results in bench/results; the
# drivers take it from BENCH_RESULTS, so that make -n shows it.
BENCH_RESULTS = $(shell RECORD='$(RECORD)' $(PYTHON) bench/stamp.py root)
BENCH_ENV = NGINX_BIN=$(NGINX_BIN) AFFINITY_MODULE=$(CURDIR)/$(MODULE) \
            BENCH_RESULTS=$(BENCH_RESULTS)

# bench/bench.py: results in $(BENCH_RESULTS)/<name>/ (quick-tight, full,
# trace, levels, instances); bench/bench.py --help for workloads,
# profiles, seeds.
bench-quick: module
	@$(BENCH_ENV) $(PYTHON) bench/bench.py --quick

bench-instances: module
	@$(BENCH_ENV) $(PYTHON) bench/bench.py --instances

bench-levels: module
	@$(BENCH_ENV) $(PYTHON) bench/bench.py --levels

bench-trace: module
	@$(BENCH_ENV) $(PYTHON) bench/bench.py --profile roomy \
	    --workload conversation --sessions on --seeds 1 --limit 0 \
	    --name trace

bench-throughput: module
	@$(BENCH_ENV) bench/bench-throughput.sh

bench-instructions: module
	@$(BENCH_ENV) PYTHON=$(PYTHON) bench/bench-instructions.sh

# The microbenchmarks' output, under the stamp (bench/stamp.py text).
MICRO_RUN = $(BUILD)/micro/affinity_micro --benchmark_min_time=0.5

bench-micro: deps
	@cmake -S bench/micro -B $(BUILD)/micro -DCMAKE_BUILD_TYPE=Release \
	    > /dev/null
	@cmake --build $(BUILD)/micro -j $(JOBS)
	@mkdir -p $(BENCH_RESULTS)
	@{ $(PYTHON) bench/stamp.py text \
	       --command 'make bench-micro ($(MICRO_RUN))' && echo && \
	   $(MICRO_RUN); } | tee $(BENCH_RESULTS)/micro.txt

bench: module bench-micro bench-throughput
	@$(BENCH_ENV) $(PYTHON) bench/bench.py

bench-faults: module
	@$(BENCH_ENV) $(PYTHON) bench/faults/run.py
	@$(MAKE) --no-print-directory bench-store-faults

bench-store-faults: module
	@$(BENCH_ENV) $(PYTHON) bench/faults/store_outage.py

demo: module
	@NGINX_BIN=$(NGINX_BIN) AFFINITY_MODULE=$(CURDIR)/$(MODULE) \
	    demo/demo.sh

clean:
	rm -rf $(BUILD)

# nginx versions to run the e2e tests against (scripts/test-matrix.sh): the
# installed Debian nginx, others built from Debian's upstream source.
MATRIX_VERSIONS ?= 1.22.1 1.26.3

# make install / make uninstall: the module, a load_module snippet in
# modules-available and its symlink in modules-enabled, laid out as Debian's
# libnginx-mod-* packages do.  For packaging: DESTDIR, PREFIX (/usr),
# SYSCONFDIR (/etc), NGINX_MODULES_DIR (default: --modules-path of
# nginx -V), NGINX_MODULE_ENABLE=0 (no modules-enabled symlink).
DESTDIR    ?=
PREFIX     ?= /usr
SYSCONFDIR ?= /etc
INSTALL_ENV = DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" \
              SYSCONFDIR="$(SYSCONFDIR)" NGINX_BIN="$(NGINX_BIN)"

.PHONY: test-matrix install uninstall deb test-deb image version

test-matrix: deps
	@scripts/test-matrix.sh $(MATRIX_VERSIONS)

install: module
	@$(INSTALL_ENV) scripts/install-module.sh install

uninstall:
	@$(INSTALL_ENV) scripts/install-module.sh uninstall

# Packaging: a Debian package of the module for the system nginx, and a
# container image (scripts/build-deb.sh, scripts/build-image.sh say how).
deb: deps
	@scripts/build-deb.sh

test-deb: deb
	@sh t/package/deb.sh

image: deps
	@scripts/build-image.sh

version:
	@sed -n 's/^#define AFFINITY_VERSION  *"\(.*\)"$$/\1/p' \
	    src/core/include/affinity_core.h
