# shoal — plain Makefile.  `make help` lists the targets.
#
# Layout: every component folder (common fetcher cache, and each room of
# engine/: text kernels forward source serve) builds into one static library
# under build/; every tool folder under tools/, the daemon and engine/cli/
# build one binary each into bin/.  Unit tests are one cmocka
# program per tests/unit/<component>/test_*.c; integration tests are the
# scripts tests/integration/test_*.sh.  tests/run.sh runs them all.

EMPTY     :=
SPACE     := $(EMPTY) $(EMPTY)

# ---- what to build for, and where -----------------------------------------
# PORTABLE=1: every Linux fast path of common/platform.h replaced by the
#   POSIX fallback macOS takes (-DSHOAL_PORTABLE), so `make test PORTABLE=1`
#   tests here what a Mac runs (docs/macos.md).  Its own tree: build-portable/.
# CROSS=aarch64-linux-gnu: cross-compile everything with $(CROSS)-gcc
#   against the Debian multiarch -dev packages (scripts/deps.sh --cross
#   installs them), into build-aarch64/; tests/integration/test_cross_aarch64.sh
#   runs the results under qemu-aarch64.
PORTABLE  ?=
CROSS     ?=
ifneq ($(CROSS),)
CC        := $(CROSS)-gcc
AR        := $(CROSS)-ar
CROSS_LIBDIR := /usr/lib/$(CROSS)
endif
BUILD_TAG := $(if $(CROSS),-$(firstword $(subst -, ,$(CROSS))))$(if $(PORTABLE),-portable)
BUILD     ?= build$(BUILD_TAG)
BIN       ?= $(if $(BUILD_TAG),$(BUILD)/bin,bin)
OPT       ?= -O2
SANITIZE  ?=
PLATFORM_CFLAGS := $(if $(PORTABLE),-DSHOAL_PORTABLE)

# The machine the code is for (not the one building it: CROSS): x86_64
# gets its AVX2/AVX-512 kernel files; arm64 (Linux aarch64, macOS arm64)
# takes the NEON kernels, which engine/kernels/ compiles wherever
# __aarch64__ is defined (gcc and Apple clang both define it) with no
# extra flags, NEON being part of armv8-a.
MACHINE   := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null || uname -m)))
ARCH      := $(if $(filter arm64 aarch64,$(MACHINE)),aarch64,$(MACHINE))
OS        := $(shell uname -s)

# ---- dependencies: pkg-config, with a fallback ------------------------------
# Each package's flags come from pkg-config where it knows the package, else
# from the fallback below (the library's usual name, no -I: a system that
# keeps the headers in the default paths).  Asked once, when first used
# (pkg-config is only asked once the dependencies exist: `make test`
# installs them, then re-enters make).
PKGS      := libcurl sqlite3 libevent libevent_pthreads jansson libpcre2-8 \
             cmocka libxxhash libcrypto
PKG_FALLBACK_libcurl           := -lcurl
PKG_FALLBACK_sqlite3           := -lsqlite3
PKG_FALLBACK_libevent          := -levent
PKG_FALLBACK_libevent_pthreads := -levent_pthreads
PKG_FALLBACK_jansson           := -ljansson
PKG_FALLBACK_libpcre2-8        := -lpcre2-8
PKG_FALLBACK_cmocka            := -lcmocka
PKG_FALLBACK_libxxhash         := -lxxhash
PKG_FALLBACK_libcrypto         := -lcrypto
# ($(shell) sees no exported variables in make 4.3: the environment is
# given on the command.)
PKG_CONFIG ?= pkg-config
ifneq ($(CROSS),)
PKG_CONFIG := PKG_CONFIG_LIBDIR=$(CROSS_LIBDIR)/pkgconfig:/usr/share/pkgconfig PKG_CONFIG_PATH= pkg-config
# Debian's libevent-dev is not multi-arch: the cross build links the arm64
# runtime libraries by their file names (scripts/deps.sh --cross).
PKG_FALLBACK_libevent          := $(firstword $(wildcard $(CROSS_LIBDIR)/libevent.so $(CROSS_LIBDIR)/libevent-2*.so.7))
PKG_FALLBACK_libevent_pthreads := $(firstword $(wildcard $(CROSS_LIBDIR)/libevent_pthreads.so $(CROSS_LIBDIR)/libevent_pthreads-2*.so.7))
endif
ifeq ($(OS),Darwin)
# Homebrew keeps openssl@3, sqlite and curl out of the default paths
# ("keg-only"); their .pc files are found through its opt/ links.
BREW      := $(shell brew --prefix 2>/dev/null)
BREW_PC   := $(foreach k,openssl@3 sqlite curl libevent,$(BREW)/opt/$(k)/lib/pkgconfig)
PKG_CONFIG := PKG_CONFIG_PATH=$(subst $(SPACE),:,$(strip $(BREW_PC) $(PKG_CONFIG_PATH))) pkg-config
endif
pkg_one   = $(shell $(PKG_CONFIG) --$(1) $(2) 2>/dev/null || echo '$(if $(filter libs,$(1)),$(PKG_FALLBACK_$(2)))')
PKG_CFLAGS = $(eval PKG_CFLAGS := $(foreach p,$(PKGS),$(call pkg_one,cflags,$(p))))$(PKG_CFLAGS)
PKG_LIBS   = $(eval PKG_LIBS := $(foreach p,$(PKGS),$(call pkg_one,libs,$(p))))$(PKG_LIBS)

# shoald tells systemd when it is ready (sd_notify) when libsystemd is
# there; without it (macOS, SYSTEMD=no) it builds all the same and a
# Type=notify unit would wait in vain: use Type=exec there.
SYSTEMD   ?= auto
HAVE_SYSTEMD = $(if $(filter no,$(SYSTEMD)),,$(shell $(PKG_CONFIG) --exists libsystemd 2>/dev/null && echo 1))
SYSTEMD_CFLAGS = $(if $(HAVE_SYSTEMD),-DHAVE_SYSTEMD $(shell $(PKG_CONFIG) --cflags libsystemd))
SYSTEMD_LIBS   = $(if $(HAVE_SYSTEMD),$(shell $(PKG_CONFIG) --libs libsystemd))

WARN      := -Wall -Wextra -Wshadow -Wformat=2 -Werror
CFLAGS    ?=
CFLAGS    += -std=c11 $(WARN) $(OPT) -g -D_GNU_SOURCE -pthread \
             -I. $(PLATFORM_CFLAGS) $(SANITIZE) -MMD -MP
LDFLAGS   += -pthread $(SANITIZE)
LDLIBS    += -lm

# ---- components (static libraries) --------------------------------------
# The engine's rooms (docs/README.md): engine/cli/ is the program and no
# library; the others are one library each, and `make lint` checks which
# room may include which.
ENGINE_ROOMS := text kernels plan forward source serve
COMPONENTS := common fetcher cache synth $(ENGINE_ROOMS)
common_SRC  := $(wildcard common/*.c)
fetcher_SRC := $(wildcard fetcher/*.c)
cache_SRC   := $(wildcard cache/*.c)
$(foreach r,$(ENGINE_ROOMS),$(eval $(r)_SRC := $(wildcard engine/$(r)/*.c)))
synth_SRC   := $(wildcard synth/*.c)

# Per-file flags: ISA variants of the kernels are compiled for their ISA
# only; the code that calls them checks the CPU once at start-up.
# (On other machines those files compile to nothing.)
ifeq ($(ARCH),x86_64)
$(BUILD)/engine/kernels/%_avx2.o:   XFLAGS := -mavx2 -mfma -mf16c
$(BUILD)/engine/kernels/%_avx512.o: XFLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni
$(BUILD)/engine/kernels/%_avxvnni.o: XFLAGS := -mavx2 -mfma -mf16c -mavxvnni
$(BUILD)/common/xxh3_avx2.o:   XFLAGS := -mavx2
$(BUILD)/common/xxh3_avx512.o: XFLAGS := -mavx2 -mavx512f
endif

ifneq ($(CROSS),)
# aarch64 gcc 12 stops with an internal error vectorizing one reduction of
# this test (vect_transform_reduction); the kernels themselves are fine.
$(BUILD)/tests/unit/kernels/test_kernels_q4: CFLAGS += -fno-tree-loop-vectorize
endif

objs = $(patsubst %.c,$(BUILD)/%.o,$(1))
lib  = $(BUILD)/lib$(1).a

# Link order: users before what they use.  Each binary and test links only
# the components it needs (so one component's half-written change does not
# break another's build); unknown ones get everything.  An engine room's
# list is what docs/README.md says it may use.
ALL_LIBS := $(foreach c,serve source forward plan text kernels fetcher cache common,$(call lib,$(c)))
libs_for = $(if $(LIBS_$(1)),$(foreach c,$(LIBS_$(1)),$(call lib,$(c))),$(ALL_LIBS))
LIBS_common   := common
LIBS_fetcher  := fetcher cache common
LIBS_cache    := cache common
LIBS_text     := text common
LIBS_kernels  := kernels common
LIBS_plan     := plan common
LIBS_forward  := forward plan kernels common
LIBS_source   := source forward plan kernels common
LIBS_serve    := serve source forward plan text kernels common
LIBS_engine   := forward plan kernels common   # bench/engine: the forward pass alone
LIBS_attn     := forward plan kernels common   # bench/attn: the old scalar code is its baseline
LIBS_synth    := synth common
LIBS_mkmodel  := synth common
LIBS_hubmock  := synth common
LIBS_stinfo   := common
LIBS_hubget   := fetcher common
LIBS_shoal-fetch := fetcher cache common
LIBS_shoald   := fetcher cache common
LIBS_shoalc   := common
LIBS_shoal-engine := serve source forward plan text kernels common
LIBS_shoal    := cache common

# ---- MPI=1: expert parallelism over MPI (engine/ranks/, docs/mpi.md) -----
# engine/ranks/ is a room of the engine.  Without MPI=1 it is the owner map
# and a refusal of --experts-over-ranks (none.c): nothing needs MPI and
# every other binary builds as before.  `make MPI=1` (best in its own
# BUILD= and BIN=, as tests/integration/test_mpi.sh does) compiles its MPI
# files and links shoal-engine with mpicc, the wrapper of Open MPI or
# MPICH (Debian: libopenmpi-dev, openmpi-bin; scripts/deps.sh installs
# them); no other binary is linked with MPI.
MPI       ?=
MPICC     ?= mpicc
COMPONENTS += ranks
LIBS_ranks := ranks source forward plan kernels common
LIBS_shoal-engine := ranks $(LIBS_shoal-engine)
ifeq ($(MPI),1)
ranks_SRC := $(filter-out engine/ranks/none.c,$(wildcard engine/ranks/*.c))
$(BUILD)/engine/ranks/%.o: CC := $(MPICC)
$(BIN)/shoal-engine: private CC := $(MPICC)
else
ranks_SRC := engine/ranks/map.c engine/ranks/none.c
endif
clean: clean-mpi
clean-mpi:
	rm -rf build-mpi build-asan-mpi
.PHONY: clean-mpi

# ---- binaries -------------------------------------------------------------
# tools/<name>/*.c -> bin/<name>; daemon/*.c -> bin/shoald;
# engine/cli/*.c -> bin/shoal-engine.
TOOLS    := $(notdir $(patsubst %/,%,$(dir $(wildcard tools/*/main.c))))
BINARIES := $(addprefix $(BIN)/,$(TOOLS))
ifneq ($(wildcard daemon/main.c),)
BINARIES += $(BIN)/shoald
endif
ifneq ($(wildcard engine/cli/main.c),)
BINARIES += $(BIN)/shoal-engine
endif

# ---- tests and benchmarks ------------------------------------------------
UNIT_SRC  := $(wildcard tests/unit/*/test_*.c)
UNIT_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
TESTLIB_SRC := $(wildcard tests/lib/*.c)
BENCH_SRC := $(wildcard bench/*/main.c)
BENCH_BINS := $(patsubst bench/%/main.c,$(BUILD)/bench/%,$(BENCH_SRC))
BENCHLIB_SRC := $(wildcard bench/lib/*.c)

.PHONY: all deps test unit integration demo asan lint bench fuzz clean help tests-build \
        man install install-dev uninstall
.DEFAULT_GOAL := all

all: check-deps $(BINARIES)

help:
	@echo "make          build every binary into bin/"
	@echo "make deps     install what the build and tests need (apt-get, npm)"
	@echo "make test     install what is missing, build, run every test"
	@echo "make demo     run the end-to-end demo on a generated tiny model"
	@echo "make asan     AddressSanitizer + UBSan build, then the tests"
	@echo "make PORTABLE=1 [test]  the POSIX paths macOS takes, built here (build-portable/)"
	@echo "make CROSS=aarch64-linux-gnu  the whole project for arm64 Linux (build-aarch64/)"
	@echo "make lint     banned functions, file and function sizes, rooms' includes"
	@echo "make bench    benchmarks; figures in bench/out/results.json"
	@echo "make fuzz     libFuzzer targets for a bounded time (clang)"
	@echo "make install  binaries, man pages, bash completion, the systemd unit into"
	@echo "              \$$DESTDIR\$$PREFIX (PREFIX=/usr/local); make uninstall removes them"
	@echo "make install-dev  the developer tools too (hubmock, mkmodel, hubget, stinfo, shoalc)"
	@echo "make clean    remove build/, bin/ and generated output"

deps:
	@scripts/deps.sh $(if $(CROSS),--cross $(CROSS))

check-deps:
	@scripts/deps.sh --check $(if $(CROSS),--cross $(CROSS)) || { echo "shoal: build dependencies are missing; run 'make deps' (or 'make test', which installs them)" >&2; exit 1; }

.PHONY: check-deps

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(XFLAGS) $(PKG_CFLAGS) -c $< -o $@

define LIB_RULE
$(call lib,$(1)): $(call objs,$($(1)_SRC))
	@mkdir -p $$(dir $$@)
	rm -f $$@
	$(AR) rcs $$@ $$^
endef
$(foreach c,$(COMPONENTS),$(eval $(call LIB_RULE,$(c))))

define TOOL_RULE
$(BIN)/$(1): $(call objs,$(wildcard tools/$(1)/*.c)) $(call libs_for,$(1))
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $$@ $$^ $$(PKG_LIBS) $(LDLIBS)
endef
$(foreach t,$(TOOLS),$(eval $(call TOOL_RULE,$(t))))

$(BUILD)/daemon/main.o: XFLAGS = $(SYSTEMD_CFLAGS)
$(BIN)/shoald: $(call objs,$(wildcard daemon/*.c)) $(call libs_for,shoald)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) $(SYSTEMD_LIBS) $(LDLIBS)

$(BIN)/shoal-engine: $(call objs,$(wildcard engine/cli/*.c)) $(call libs_for,shoal-engine)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

define UNIT_RULE
$(BUILD)/tests/unit/$(1)/%: tests/unit/$(1)/%.c $(call objs,$(TESTLIB_SRC)) $(call libs_for,$(1))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(PKG_CFLAGS) -o $$@ $$< $(call objs,$(TESTLIB_SRC)) $(call libs_for,$(1)) $$(LDFLAGS) $$(PKG_LIBS) $$(LDLIBS)
endef
$(foreach c,$(COMPONENTS),$(eval $(call UNIT_RULE,$(c))))

define BENCH_RULE
$(BUILD)/bench/$(1): $(wildcard bench/$(1)/*.c) $(call objs,$(BENCHLIB_SRC)) $(call libs_for,$(1))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(PKG_CFLAGS) -o $$@ $(wildcard bench/$(1)/*.c) $(call objs,$(BENCHLIB_SRC)) $(call libs_for,$(1)) $$(LDFLAGS) $$(PKG_LIBS) $$(LDLIBS)
endef
BENCH_NAMES := $(patsubst bench/%/main.c,%,$(BENCH_SRC))
$(foreach b,$(BENCH_NAMES),$(eval $(call BENCH_RULE,$(b))))

tests-build: all $(UNIT_BINS)

# `make test` installs what is missing first, then re-enters make so that
# pkg-config sees the freshly installed packages.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# The aarch64 cross test's multiarch packages (test_cross_aarch64.sh) are
# installed before the suite starts, not by the test while others run: an
# install can upgrade the host's shared libraries to the versions the arm64
# ones must match.  Where they cannot be installed the test says why and skips.
ifeq ($(shell uname -m)$(PORTABLE)$(CROSS),x86_64)
TEST_CROSS_DEPS = scripts/deps.sh --if-missing --cross aarch64-linux-gnu \
	|| echo "deps: the aarch64 cross packages are not installed; test_cross_aarch64 will skip"
else
TEST_CROSS_DEPS = true
endif

test:
	@scripts/deps.sh --if-missing
	@$(TEST_CROSS_DEPS)
	@$(MAKE) --no-print-directory -j$(JOBS) tests-build
	@BUILD=$(BUILD) BIN=$(BIN) SHOAL_PORTABLE=$(PORTABLE) tests/run.sh

unit integration:
	@$(MAKE) --no-print-directory tests-build
	@BUILD=$(BUILD) BIN=$(BIN) SHOAL_PORTABLE=$(PORTABLE) tests/run.sh --$@

demo:
	@scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@scripts/demo.sh

asan:
	@scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(JOBS) tests-build BUILD=build-asan BIN=build-asan/bin OPT=-O1 \
	    SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
	@BUILD=build-asan BIN=build-asan/bin ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 SHOAL_ASAN=1 tests/run.sh

lint:
	@scripts/lint.sh

bench:
	@scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory all $(BENCH_BINS)
	@BUILD=$(BUILD) BIN=$(BIN) scripts/bench.sh

# bench-k3: the 64 GB regime on a full-width 8-layer K3 (not part of make bench:
# minutes, ~40 GB of disk while it runs, removed after; docs/performance.md)
.PHONY: bench-k3
bench-k3:
	@scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory all
	@set -e; for s in bench/k3/*.sh; do \
	    case $$s in */lib.sh) continue;; esac; \
	    echo "== $$s"; BIN=$(BIN) bash $$s; done

fuzz:
	@scripts/fuzz.sh

clean:
	rm -rf build build-asan build-fuzz build-portable build-aarch64 build-aarch64-portable bin bench/out demo

# ---- install ---------------------------------------------------------------
# What a user runs is installed; the developer tools (hubmock, mkmodel,
# hubget, stinfo, shoalc: tests, benchmarks, the demo) stay in bin/ unless
# `make install-dev`.  Man pages and bash completions are made by the
# built binaries from their own option tables (`PROG --help-man`,
# `PROG --help-completion`; common/cli.h), so they say what the binary
# does.  The systemd user unit gets ExecStart= pointing into PREFIX; the
# system-wide unit is an example under the docs.
PREFIX    ?= /usr/local
DESTDIR   ?=
BINDIR    ?= $(PREFIX)/bin
MANDIR    ?= $(PREFIX)/share/man
DOCDIR    ?= $(PREFIX)/share/doc/shoal
COMPDIR   ?= $(PREFIX)/share/bash-completion/completions
UNITDIR   ?= $(PREFIX)/lib/systemd/user
USER_BINS := shoald shoal shoal-engine shoal-fetch
DEV_BINS  := hubmock mkmodel hubget stinfo shoalc
man_name   = $(1).$(if $(filter shoald,$(1)),8,1)
MAN_PAGES  = $(foreach b,$(USER_BINS) $(DEV_BINS),$(BUILD)/man/$(call man_name,$(b)))
COMPLETIONS = $(addprefix $(BUILD)/completion/,$(USER_BINS) $(DEV_BINS))

$(BUILD)/man/%.1: $(BIN)/%
	@mkdir -p $(dir $@)
	$< --help-man > $@.tmp && mv $@.tmp $@
$(BUILD)/man/%.8: $(BIN)/%
	@mkdir -p $(dir $@)
	$< --help-man > $@.tmp && mv $@.tmp $@
$(BUILD)/completion/%: $(BIN)/%
	@mkdir -p $(dir $@)
	$< --help-completion > $@.tmp && mv $@.tmp $@

man: all $(MAN_PAGES) $(COMPLETIONS)

# install_bins DIR-less list: each binary with its man page and completion
install_bins = for b in $(1); do s=1; [ $$b = shoald ] && s=8; \
	    install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man$$s $(DESTDIR)$(COMPDIR) && \
	    install -m 0755 $(BIN)/$$b $(DESTDIR)$(BINDIR)/$$b && \
	    install -m 0644 $(BUILD)/man/$$b.$$s $(DESTDIR)$(MANDIR)/man$$s/$$b.$$s && \
	    install -m 0644 $(BUILD)/completion/$$b $(DESTDIR)$(COMPDIR)/$$b || exit 1; done

install: man
	$(call install_bins,$(USER_BINS))
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(DOCDIR)/docs
	sed 's|/usr/local/bin/|$(BINDIR)/|g' contrib/systemd/shoald.service \
	    > $(DESTDIR)$(UNITDIR)/shoald.service
	sed 's|/usr/local/bin/|$(BINDIR)/|g' contrib/systemd/shoald-system.service \
	    > $(DESTDIR)$(DOCDIR)/examples/shoald-system.service
	sed 's|/usr/local/bin/|$(BINDIR)/|g' contrib/launchd/org.shoal.shoald.plist \
	    > $(DESTDIR)$(DOCDIR)/examples/org.shoal.shoald.plist
	chmod 0644 $(DESTDIR)$(UNITDIR)/shoald.service $(DESTDIR)$(DOCDIR)/examples/shoald-system.service \
	    $(DESTDIR)$(DOCDIR)/examples/org.shoal.shoald.plist
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/
	@echo "installed into $(DESTDIR)$(PREFIX): $(USER_BINS), their man pages and completions;"
	@echo "the user unit $(UNITDIR)/shoald.service (systemctl --user enable --now shoald)"
	@echo "(macOS: the launchd agent $(DOCDIR)/examples/org.shoal.shoald.plist; docs/macos.md)"

install-dev: install
	$(call install_bins,$(DEV_BINS))

uninstall:
	rm -f $(foreach b,$(USER_BINS) $(DEV_BINS),$(DESTDIR)$(BINDIR)/$(b) \
	    $(DESTDIR)$(MANDIR)/man$(if $(filter shoald,$(b)),8,1)/$(call man_name,$(b)) \
	    $(DESTDIR)$(COMPDIR)/$(b))
	rm -f $(DESTDIR)$(UNITDIR)/shoald.service
	rm -rf $(DESTDIR)$(DOCDIR)

-include $(shell find $(BUILD) $(if $(filter build,$(BUILD)),build-asan) -name '*.d' 2>/dev/null)
