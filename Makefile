# kvstash: one plain GNU Makefile.
#
#   make            build the release variant (build/release/)
#   make run        deps + build + kvstashd in the foreground with conf/kvstashd.conf
#   make test       deps + build + the whole test suite
#   make help       every target
#
# Variants never mix: VARIANT=release|debug|asan picks build/<variant>/.

VARIANT ?= release
V ?= 0
RDMA ?= 1
PREFIX ?= /usr/local
BUILD := build/$(VARIANT)$(if $(filter 0,$(RDMA)),-nordma)

CC ?= cc
PKGS := libevent_core libevent_extra libevent_openssl libevent_pthreads msgpack lmdb libssl libcrypto
WARN := -std=c11 -Wall -Wextra -pedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wformat=2 -Wpointer-arith -Wno-format-nonliteral -Werror
CPPFLAGS_BASE := -D_GNU_SOURCE -Iutil -Iprotocol -Istorage -Irdma -Iclient -Isrc -Isrc/rpc -Isrc/cluster \
                 -MMD -MP

ifeq ($(VARIANT),release)
  OPT := -O2 -g
else ifeq ($(VARIANT),debug)
  OPT := -O0 -g3
else ifeq ($(VARIANT),asan)
  OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
  SANLDFLAGS := -fsanitize=address,undefined
else
  $(error VARIANT must be release, debug or asan)
endif

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS_ALL = $(WARN) $(OPT) $(CPPFLAGS_BASE) $(PKG_CFLAGS) -fPIC $(CFLAGS)
LDFLAGS_ALL = $(SANLDFLAGS) $(LDFLAGS)
LIBS_ALL = $(PKG_LIBS) -lpthread -lm $(LIBS)

ifeq ($(V),0)
  Q := @
  say = @printf '  %-6s %s\n' $(1) $(2);
else
  Q :=
  say =
endif

# ---- sources ----
# Layers, lowest first (docs/architecture.md; tests/check_layers.py keeps them):
#   util/      leaf utilities: log, clock, version, TCP options, OpenSSL's error text
#   protocol/  the wire: framing, msgpack cursor, status codes
#   storage/   the store and its tiers;  rdma/  the RDMA data port
#   client/    libkvstash and the kvstash CLI
#   src/       the daemon; src/rpc/ its request layer
UTIL_SRC := util/log.c util/tcpopt.c util/sdnotify.c util/tls_error.c util/prio.c
PROTO_SRC := protocol/kverr.c protocol/frame.c protocol/mp.c protocol/resp.c
STORAGE_SRC := storage/alloc.c storage/alloc_file.c storage/store.c storage/store_tier.c storage/store_hash.c \
               storage/store_evict.c storage/crc32c.c storage/ssd_record.c storage/ssd_index.c \
               storage/ssd.c storage/ssd_bucket.c storage/ssd_writer.c storage/ssd_scan.c \
               storage/ssd_rebuild.c storage/ssd_clean.c storage/ssd_compact.c storage/copier.c \
               storage/ssd_summary.c storage/ssd_sumfile.c storage/ssd_scrub.c \
               storage/shmbuf.c
RPC_SRC := $(wildcard src/rpc/*.c)
# the pool: placement, views, etcd membership, peers (docs/cluster.md)
CLUSTER_SRC := $(wildcard src/cluster/*.c)
CORE_SRC := $(UTIL_SRC) $(PROTO_SRC) $(STORAGE_SRC) src/config.c src/config_value.c \
            src/config_cluster.c $(RPC_SRC) $(CLUSTER_SRC)
# the RDMA data port and its verbs table (or the RDMA=0 stub); the emulation (rdma_emu.c), a
# test double, is linked into the tests only
RDMA_SRC := rdma/rdma_port.c
ifeq ($(RDMA),1)
  RDMA_SRC += rdma/rdma_verbs.c
  PKGS += libibverbs
  RDMA_LIBS := -libverbs
else
  RDMA_SRC += rdma/rdma_stub.c
  RDMA_LIBS :=
endif
CORE_SRC += $(RDMA_SRC)
DAEMON_SRC := src/main.c src/server.c src/worker.c src/conn.c src/conn_read.c src/conn_proto.c \
              src/stats.c src/tls.c src/transport.c src/transport_tls.c src/metrics.c src/admin.c
CLIENT_SRC := client/kvstash.c client/kvstash_buffer.c client/kvstash_async.c client/kvstash_wire.c \
              client/kvstash_reply.c client/kvstash_rdma.c $(UTIL_SRC) $(PROTO_SRC) $(RDMA_SRC)
CLI_SRC := client/kvstash_cli.c client/cli_monitor.c client/cli_cluster.c
EMU_SRC := rdma/rdma_emu.c
BENCH_SRC := tests/bench/kvstash_bench.c tests/bench/bench_util.c
MCBENCH_SRC := tests/bench/mc_bench.c tests/bench/bench_util.c util/tcpopt.c
RAWBENCH_SRC := tests/bench/raw_bench.c tests/bench/bench_util.c util/tcpopt.c
# test_rpc.c and test_rpc_put.c share their environment and helpers (rpc_testlib.c)
UNIT_SRC := $(wildcard tests/unit/test_*.c) tests/unit/rpc_testlib.c
INTEG_SRC := $(wildcard tests/integration/test_*.c) $(wildcard tests/lib/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
CORE_OBJ := $(call obj,$(CORE_SRC))
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))

KVSTASHD := $(BUILD)/kvstashd
KVSTASH := $(BUILD)/kvstash
BENCH := $(BUILD)/kvstash-bench
MCBENCH := $(BUILD)/mc-bench
RAWBENCH := $(BUILD)/raw-bench
LIBCORE := $(BUILD)/libkvcore.a
LIBCLIENT_A := $(BUILD)/libkvstash.a
LIBCLIENT_SO := $(BUILD)/libkvstash.so
# the ABI's major version (the library's SONAME libkvstash.so.N; client/libkvstash.map)
SOVERSION := 0
PLACESIM := $(BUILD)/place-sim
UNIT := $(BUILD)/unit-tests
INTEG := $(BUILD)/integration-tests

.PHONY: all run test deps bench-deps asan fuzz bench soak install uninstall man deb format clean help \
        test-layers test-unit test-integration test-python test-fuzz check-deps \
        test-cluster cluster-test cluster-sim cluster-replay

all: $(KVSTASHD) $(KVSTASH) $(BENCH) $(LIBCLIENT_A) $(LIBCLIENT_SO)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIBCORE): $(CORE_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(LIBCLIENT_A): $(CLIENT_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(LIBCLIENT_SO): $(CLIENT_OBJ) client/libkvstash.map
	$(call say,LD,$@)$(CC) -shared $(LDFLAGS_ALL) -Wl,--version-script=client/libkvstash.map \
	    -Wl,-soname,libkvstash.so.$(SOVERSION) \
	    -o $@ $(CLIENT_OBJ) -lmsgpackc -lssl -lcrypto $(RDMA_LIBS)

$(KVSTASHD): $(DAEMON_OBJ) $(LIBCORE)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $(DAEMON_OBJ) $(LIBCORE) $(LIBS_ALL)

$(KVSTASH): $(call obj,$(CLI_SRC)) $(LIBCLIENT_A)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ -lmsgpackc -lssl -lcrypto $(RDMA_LIBS)

$(BENCH): $(call obj,$(BENCH_SRC)) $(LIBCLIENT_A)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ -lmsgpackc -lssl -lcrypto $(RDMA_LIBS) -lpthread

# the memcached peer's load generator: libc and pthreads only; built by make bench
$(MCBENCH): $(call obj,$(MCBENCH_SRC))
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ -lpthread

# the loopback TCP ceiling (request -> reply, no store): libc and pthreads; built by make bench
$(RAWBENCH): $(call obj,$(RAWBENCH_SRC))
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ -lpthread

$(UNIT): $(call obj,$(UNIT_SRC) $(EMU_SRC)) $(LIBCORE)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL) -lcriterion

# the daemon's objects but main: the RDMA path test runs a server in-process
$(INTEG): $(call obj,$(INTEG_SRC) $(EMU_SRC)) $(call obj,$(filter-out src/main.c,$(DAEMON_SRC))) \
          $(LIBCLIENT_A) $(LIBCORE)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL) -lcriterion

# the placement simulator (tests/cluster/place_sim.c): place.c alone, nothing of the daemon
$(PLACESIM): $(call obj,tests/cluster/place_sim.c src/cluster/place.c)
	$(call say,LD,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ -lpthread -lm

# ---- dependencies (Debian 12 packages) ----
DEB_PKGS := build-essential pkg-config libevent-dev libmsgpack-dev libssl-dev liblmdb-dev \
            libibverbs-dev libcriterion-dev python3 python3-msgpack python3-pytest \
            clang libclang-rt-14-dev openssl python3-numpy \
            lintian man-db tmux python3-yaml python3-redis redis-tools prometheus \
            python3-prometheus-client etcd-server

# tools only `make bench` uses (fio: the SSD section's device baseline; gnuplot: the chart)
BENCH_PKGS := fio gnuplot-nox redis-server

# apt_install TARGET,PACKAGES: apt-get install those of PACKAGES not installed yet
define apt_install
	@missing=""; for p in $(2); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "make $(1): installing$$missing"; \
	    if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi
endef

deps:
	$(call apt_install,deps,$(DEB_PKGS))

# after deps, never beside it: two apt-gets at once fight over dpkg's lock
bench-deps: deps
	$(call apt_install,bench-deps,$(BENCH_PKGS))

# ---- running ----
run: deps
	$(Q)$(MAKE) --no-print-directory all
	mkdir -p var
	exec $(KVSTASHD) --config conf/kvstashd.conf

# ---- tests ----
TEST_JOBS ?= 2

test: deps
	$(Q)$(MAKE) --no-print-directory all $(UNIT) $(INTEG)
	$(Q)$(MAKE) --no-print-directory test-layers test-unit test-integration test-python \
	    test-cluster test-fuzz

# make asan's sanitizer settings; a variable set in the environment is used instead.
# handle_sigbus=0: SIGBUS is kvstashd's own (storage/shmbuf.c guards clients' buffers that may
# shrink and passes any other SIGBUS on to the handler before it). With ASan's default (1) the
# guard still takes the buffers' faults (its sigaction replaces ASan's), but any other SIGBUS
# goes on to ASan, which reports it and exits 1 instead of dying by the signal as release
# builds do (test_shmbuf's a_fault_elsewhere_stays_a_crash checks the signal).
SAN_ASAN_OPTIONS := abort_on_error=0:detect_leaks=1:handle_sigbus=0
SAN_LSAN_OPTIONS := suppressions=$(abspath tests/data/lsan.supp):print_suppressions=0
SAN_UBSAN_OPTIONS := print_stacktrace=1:halt_on_error=1

# criterion_run NAME,COMMAND: run a Criterion test binary. Under VARIANT=asan: Criterion runs
# each test in a worker process and ignores how a worker exits once its test has passed, so
# LeakSanitizer's report at the worker's exit fails nothing by itself. Every sanitizer report
# therefore goes to build/asan/sanlog/NAME/san.PID (log_path: the runner, its workers, and the
# daemons and CLI the integration tests start), and any such file fails the run after it is
# printed. gcc's libubsan ignores log_path when libasan is loaded as well, so a UBSan
# "runtime error:" line in the binary's output fails it too. fast_unwind_on_malloc=0 gives
# whole allocation stacks through libcriterion, which the suppression file matches on.
ifeq ($(VARIANT),asan)
define criterion_run
	@echo '$(2)'
	@d=$(abspath $(BUILD))/sanlog/$(1); rm -rf $$d && mkdir -p $$d; \
	{ ASAN_OPTIONS="$${ASAN_OPTIONS:-$(SAN_ASAN_OPTIONS)}:log_path=$$d/san:fast_unwind_on_malloc=0" \
	  LSAN_OPTIONS="$${LSAN_OPTIONS:-$(SAN_LSAN_OPTIONS)}:log_path=$$d/san" \
	  UBSAN_OPTIONS="$${UBSAN_OPTIONS:-$(SAN_UBSAN_OPTIONS)}:log_path=$$d/san" \
	  $(2) 2>&1; echo $$? >$$d/status; } | tee $$d/output; \
	rc=$$(cat $$d/status); \
	for f in $$d/san.*; do \
	    [ -e "$$f" ] || continue; echo "---- sanitizer report $$f"; cat "$$f"; rc=1; \
	done; \
	if grep -q 'runtime error:' $$d/output; then \
	    echo "---- UBSan reported in the output above (saved in $$d/output)"; rc=1; \
	fi; \
	exit $$rc
endef
else
  criterion_run = $(2)
endif

# the pool (tests/cluster/, docs/cluster.md): a real etcd and daemons on 127.0.0.x.
# make test runs the quick set (placement against the reference, boot and one view, a
# duplicate node_id, the data paths on a fixed view, a join); make cluster-test runs them all
# (about two minutes)
CLUSTER_PYTEST = KVSTASHD=$(abspath $(KVSTASHD)) KVSTASH_CLI=$(abspath $(KVSTASH)) \
                 /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider

test-cluster: $(KVSTASHD) $(KVSTASH)
	$(CLUSTER_PYTEST) -m quick tests/cluster

cluster-test: deps
	$(Q)$(MAKE) --no-print-directory all
	$(CLUSTER_PYTEST) tests/cluster

# 1,000 nodes, 10M keys: movement on a join and a leave against the ideal, load against
# weight (PLACE_SIM_ARGS: e.g. -k 1000000 for a quicker run)
cluster-sim: $(PLACESIM)
	$(PLACESIM) $(PLACE_SIM_ARGS)

# Mooncake's synthetic trace over N engines: pooled hit rate against N isolated caches
cluster-replay:
	/usr/bin/python3 tests/cluster/trace_replay.py $(TRACE_REPLAY_ARGS)

# the include lines keep the layers of docs/architecture.md
test-layers:
	/usr/bin/python3 tests/check_layers.py

test-unit: $(UNIT)
	$(call criterion_run,unit,$(UNIT) --jobs $(TEST_JOBS))

test-integration: $(INTEG) $(KVSTASHD) $(KVSTASH)
	$(call criterion_run,integration,KVSTASHD=$(abspath $(KVSTASHD)) \
	    KVSTASH_CLI=$(abspath $(KVSTASH)) $(INTEG) --jobs 1)

# test_packaging.py checks the package (KVSTASH_DEB), so it is built first (from the release
# build whatever VARIANT is: the package is what users install; DEB is defined further down)
test-python: $(KVSTASHD) $(KVSTASH) $(BENCH) $(MCBENCH)
	$(Q)$(MAKE) --no-print-directory VARIANT=release deb
	KVSTASHD=$(abspath $(KVSTASHD)) KVSTASH_CLI=$(abspath $(KVSTASH)) KVSTASH_DEB=$(abspath $(DEB)) \
	    /usr/bin/python3 -m pytest -q -rs tests/integration

asan:
	$(Q)ASAN_OPTIONS=$(SAN_ASAN_OPTIONS) LSAN_OPTIONS=$(SAN_LSAN_OPTIONS) \
	    UBSAN_OPTIONS=$(SAN_UBSAN_OPTIONS) $(MAKE) --no-print-directory VARIANT=asan test

bench: bench-deps
	$(Q)$(MAKE) --no-print-directory all $(MCBENCH) $(RAWBENCH)
	@mkdir -p build/bench
	{ KVSTASHD=$(abspath $(KVSTASHD)) BENCH=$(abspath $(BENCH)) MCBENCH=$(abspath $(MCBENCH)) \
	    RAWBENCH=$(abspath $(RAWBENCH)) tests/bench/run.sh; echo $$? >build/bench/run.rc; } \
	    2>&1 | tee build/bench/run.log
	@# the summary as build/bench/summary.{txt,dat,png}, even when a row failed
	/usr/bin/python3 tests/bench/chart.py build/bench/run.log build/bench
	@exit $$(cat build/bench/run.rc)

# random concurrent traffic with every value checked, SIGHUPs and SIGKILLs (tests/soak/)
SOAK_SECONDS ?= 60
soak: deps
	$(Q)$(MAKE) --no-print-directory all
	KVSTASHD=$(abspath $(KVSTASHD)) KVSTASH_CLI=$(abspath $(KVSTASH)) SOAK_SECONDS=$(SOAK_SECONDS) \
	    tests/soak/run.sh

# ---- fuzzing (tests/fuzz/): libFuzzer targets built with clang, ASan and UBSan ----
FUZZ_CC ?= clang
FUZZ_DIR := build/fuzz
FUZZ_TARGETS := frame rpc config resp json summary
FUZZ_SECONDS ?= 60
FUZZ_FLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_BINS := $(addprefix $(FUZZ_DIR)/fuzz-,$(FUZZ_TARGETS))
fuzz_obj = $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(1))

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(FUZZ_CC) $(WARN) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(CPPFLAGS_BASE) \
	    $(PKG_CFLAGS) -c $< -o $@

# kept between builds (make would delete them as intermediates of the pattern rule)
# fuzz_env.c: the request fuzzers' shared store and request-layer state
FUZZ_ENV := tests/fuzz/fuzz_env.c
.SECONDARY: $(call fuzz_obj,$(CORE_SRC) $(FUZZ_ENV) $(addprefix tests/fuzz/fuzz_,$(addsuffix .c,$(FUZZ_TARGETS))))

$(FUZZ_DIR)/fuzz-%: $(call fuzz_obj,tests/fuzz/fuzz_%.c $(FUZZ_ENV)) $(call fuzz_obj,$(CORE_SRC))
	$(call say,LD,$@)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(LIBS_ALL)

# fuzz_run SECONDS: run every target that long from its seed corpus (tests/fuzz/corpus/T);
# new inputs go to build/fuzz/work-T, a crash, leak or timeout fails with its input saved
# in build/fuzz/ (copy it into the corpus once fixed: it stays a regression input)
define fuzz_run
	@set -e; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/work-$$t; \
	    echo "fuzz-$$t: $(1) s from tests/fuzz/corpus/$$t"; \
	    $(FUZZ_DIR)/fuzz-$$t -max_total_time=$(1) -timeout=10 -rss_limit_mb=2048 \
	        -artifact_prefix=$(FUZZ_DIR)/$$t- -print_final_stats=1 \
	        $(FUZZ_DIR)/work-$$t tests/fuzz/corpus/$$t 2>$(FUZZ_DIR)/fuzz-$$t.log \
	        || { tail -40 $(FUZZ_DIR)/fuzz-$$t.log; exit 1; }; \
	    grep -h "stat::number_of_executed_units" $(FUZZ_DIR)/fuzz-$$t.log; \
	done
endef

fuzz: deps $(FUZZ_BINS)
	$(call fuzz_run,$(FUZZ_SECONDS))

# make test's share: about 30 s per target
test-fuzz: $(FUZZ_BINS)
	$(call fuzz_run,30)

# ---- install ----
# The Python package (client/python/kvstash, docs/python.md) goes where Debian's
# /usr/bin/python3 looks: /usr/lib/python3/dist-packages for PREFIX=/usr, else
# PREFIX/lib/python3.X/dist-packages (/usr/local/lib/python3.11/dist-packages on Debian 12).
PY_PKG := $(wildcard client/python/kvstash/*.py)
PYTHON_SITE ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(shell /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)/dist-packages)

# Where the rest goes: /etc for PREFIX=/usr (the package), else PREFIX/etc; man pages
# under PREFIX/share/man. kvstashd.conf(5) is rendered from the option table
# (kvstashd --dump-options) and conf/kvstashd.conf's comments: see packaging/man/.
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
MANDIR ?= $(PREFIX)/share/man
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
VERSION := $(shell sed -n 's/^\#define KVSTASH_VERSION "\(.*\)"/\1/p' util/version.h)
MAN_PAGES := $(BUILD)/man/kvstashd.8 $(BUILD)/man/kvstash.1 $(BUILD)/man/kvstashd.conf.5

$(BUILD)/man/kvstashd.conf.5: $(KVSTASHD) conf/kvstashd.conf packaging/man/gen_conf_man.py
	@mkdir -p $(dir $@)
	$(call say,MAN,$@)$(KVSTASHD) --dump-options >$@.tsv && \
	    /usr/bin/python3 packaging/man/gen_conf_man.py $@.tsv conf/kvstashd.conf $(VERSION) >$@.tmp \
	    && mv $@.tmp $@

$(BUILD)/man/%: packaging/man/%
	@mkdir -p $(dir $@)
	$(call say,MAN,$@)sed 's/^\.TH \([A-Z.]*\) \([0-9]\) "" "kvstash"/.TH \1 \2 "" "kvstash $(VERSION)"/' $< >$@

# kvstash.pc, written at install time: its paths are those of this PREFIX
define write_pc
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	    'Name: kvstash' 'Description: client library of the kvstash KV-cache block store' \
	    'Version: $(VERSION)' 'Requires.private: msgpack libssl libcrypto' \
	    'Libs: -L$${libdir} -lkvstash' 'Libs.private: $(RDMA_LIBS)' 'Cflags: -I$${includedir}' \
	    >$(1) && chmod 0644 $(1)
endef

man: $(MAN_PAGES)

install: all $(MAN_PAGES)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/kvstash $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 \
	    $(DESTDIR)$(MANDIR)/man8
	install -m 0755 $(KVSTASHD) $(KVSTASH) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(LIBCLIENT_A) $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(LIBCLIENT_SO) $(DESTDIR)$(LIBDIR)/libkvstash.so.$(SOVERSION)
	ln -sf libkvstash.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libkvstash.so
	install -m 0644 client/kvstash.h $(DESTDIR)$(INCLUDEDIR)/
	$(call write_pc,$(DESTDIR)$(LIBDIR)/pkgconfig/kvstash.pc)
	install -d $(DESTDIR)$(PYTHON_SITE)/kvstash
	install -m 0644 $(PY_PKG) $(DESTDIR)$(PYTHON_SITE)/kvstash/
	@# an existing config is the operator's: never overwritten
	test -e $(DESTDIR)$(SYSCONFDIR)/kvstash/kvstashd.conf || \
	    install -m 0644 conf/kvstashd.conf $(DESTDIR)$(SYSCONFDIR)/kvstash/kvstashd.conf
	install -m 0644 $(BUILD)/man/kvstash.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(BUILD)/man/kvstashd.conf.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 $(BUILD)/man/kvstashd.8 $(DESTDIR)$(MANDIR)/man8/

# the config file stays unless it is the one installed (an edited one is the operator's)
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/kvstashd $(DESTDIR)$(PREFIX)/bin/kvstash \
	      $(DESTDIR)$(LIBDIR)/libkvstash.a $(DESTDIR)$(LIBDIR)/libkvstash.so \
	      $(DESTDIR)$(LIBDIR)/libkvstash.so.$(SOVERSION) \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/kvstash.pc $(DESTDIR)$(INCLUDEDIR)/kvstash.h \
	      $(DESTDIR)$(MANDIR)/man1/kvstash.1 $(DESTDIR)$(MANDIR)/man5/kvstashd.conf.5 \
	      $(DESTDIR)$(MANDIR)/man8/kvstashd.8
	rm -rf $(DESTDIR)$(PYTHON_SITE)/kvstash
	if cmp -s conf/kvstashd.conf $(DESTDIR)$(SYSCONFDIR)/kvstash/kvstashd.conf; then \
	    rm -f $(DESTDIR)$(SYSCONFDIR)/kvstash/kvstashd.conf; \
	    rmdir $(DESTDIR)$(SYSCONFDIR)/kvstash 2>/dev/null || true; \
	fi

# ---- Debian package (packaging/deb/): build/deb/kvstash_VERSION_ARCH.deb ----
DEB_DIR := build/deb
DEB := $(DEB_DIR)/kvstash_$(VERSION)_$(shell dpkg --print-architecture 2>/dev/null).deb

deb: $(DEB)

$(DEB): all $(MAN_PAGES) $(wildcard packaging/deb/*) conf/kvstashd.conf
	rm -rf $(DEB_DIR)/root
	$(Q)$(MAKE) --no-print-directory install DESTDIR=$(abspath $(DEB_DIR)/root) PREFIX=/usr >/dev/null
	packaging/deb/build.sh $(abspath $(DEB_DIR)/root) $(abspath $(DEB_DIR)) $(VERSION)

format:
	clang-format -i $(wildcard util/*.[ch] protocol/*.[ch] storage/*.[ch] rdma/*.[ch] \
	    client/*.[ch] src/*.[ch] src/rpc/*.[ch] tests/*/*.[ch])

clean:
	rm -rf build

help:
	@echo "targets: all run test deps bench-deps asan fuzz bench soak install uninstall format clean help"
	@echo "         cluster-test (the pool's tests, a real etcd) cluster-sim (placement simulator)"
	@echo "         cluster-replay (Mooncake's trace: pooled against isolated caches)"
	@echo "vars:    VARIANT=release|debug|asan  V=1 (verbose)  PREFIX=$(PREFIX)"

-include $(shell find build -name '*.d' -type f 2>/dev/null)
