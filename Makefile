# ngx_http_upstream_affinity_module
#
#   make                 install missing Debian packages, build the module
#                        into build/ngx_http_upstream_affinity_module.so
#   make NGINX_SRC=dir   build against another nginx source tree
#   make test            unit tests (also under ASan+UBSan) and e2e tests
#   make demo            start nginx with the module and three backends,
#                        and show where each session's requests go
#   make clean

NGINX_SRC ?=
NGINX_BIN ?= /usr/sbin/nginx
BUILD     := build
MODULE    := $(BUILD)/ngx_http_upstream_affinity_module.so
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps module unit unit-asan e2e test demo clean

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

test: unit unit-asan e2e

demo: module
	@NGINX_BIN=$(NGINX_BIN) AFFINITY_MODULE=$(CURDIR)/$(MODULE) \
	    scripts/demo.sh

clean:
	rm -rf $(BUILD)
