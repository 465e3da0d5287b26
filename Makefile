# shoal — plain Makefile.  `make help` lists the targets.
#
# Layout: every component folder (common fetcher cache, and each room of
# engine/: text kernels forward source serve) builds into one static library
# under build/; every tool folder under tools/, the daemon and engine/cli/
# build one binary each into bin/.  Unit tests are one cmocka
# program per tests/unit/<component>/test_*.c; integration tests are the
# scripts tests/integration/test_*.sh.  tests/run.sh runs them all.

CC        ?= cc
BUILD     ?= build
BIN       ?= bin
OPT       ?= -O2
SANITIZE  ?=
PKGS      := libcurl sqlite3 libevent libevent_pthreads jansson libpcre2-8 \
             cmocka libxxhash libcrypto

# Evaluated lazily: pkg-config is only asked once the dependencies exist.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# shoald tells systemd when it is ready (sd_notify) when libsystemd is
# there; without it (macOS, SYSTEMD=no) it builds all the same and a
# Type=notify unit would wait in vain: use Type=exec there.
SYSTEMD   ?= auto
HAVE_SYSTEMD = $(if $(filter no,$(SYSTEMD)),,$(shell pkg-config --exists libsystemd 2>/dev/null && echo 1))
SYSTEMD_CFLAGS = $(if $(HAVE_SYSTEMD),-DHAVE_SYSTEMD $(shell pkg-config --cflags libsystemd))
SYSTEMD_LIBS   = $(if $(HAVE_SYSTEMD),$(shell pkg-config --libs libsystemd))

WARN      := -Wall -Wextra -Wshadow -Wformat=2 -Werror
CFLAGS    ?=
CFLAGS    += -std=c11 $(WARN) $(OPT) -g -D_GNU_SOURCE -pthread \
             -I. $(SANITIZE) -MMD -MP
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
ifeq ($(shell uname -m),x86_64)
$(BUILD)/engine/kernels/%_avx2.o:   XFLAGS := -mavx2 -mfma -mf16c
$(BUILD)/engine/kernels/%_avx512.o: XFLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni
$(BUILD)/engine/kernels/%_avxvnni.o: XFLAGS := -mavx2 -mfma -mf16c -mavxvnni
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
	@echo "make lint     banned functions, file and function sizes, rooms' includes"
	@echo "make bench    benchmarks; figures in bench/out/results.json"
	@echo "make fuzz     libFuzzer targets for a bounded time (clang)"
	@echo "make install  binaries, man pages, bash completion, the systemd unit into"
	@echo "              \$$DESTDIR\$$PREFIX (PREFIX=/usr/local); make uninstall removes them"
	@echo "make install-dev  the developer tools too (hubmock, mkmodel, hubget, stinfo, shoalc)"
	@echo "make clean    remove build/, bin/ and generated output"

deps:
	@scripts/deps.sh

check-deps:
	@scripts/deps.sh --check || { echo "shoal: build dependencies are missing; run 'make deps' (or 'make test', which installs them)" >&2; exit 1; }

.PHONY: check-deps

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(XFLAGS) $(PKG_CFLAGS) -c $< -o $@

define LIB_RULE
$(call lib,$(1)): $(call objs,$($(1)_SRC))
	@mkdir -p $$(dir $$@)
	rm -f $$@
	ar rcs $$@ $$^
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

test:
	@scripts/deps.sh --if-missing
	@$(MAKE) --no-print-directory -j$(JOBS) tests-build
	@BUILD=$(BUILD) BIN=$(BIN) tests/run.sh

unit integration:
	@$(MAKE) --no-print-directory tests-build
	@BUILD=$(BUILD) BIN=$(BIN) tests/run.sh --$@

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
	rm -rf build build-asan build-fuzz bin bench/out demo

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
	chmod 0644 $(DESTDIR)$(UNITDIR)/shoald.service $(DESTDIR)$(DOCDIR)/examples/shoald-system.service
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/
	@echo "installed into $(DESTDIR)$(PREFIX): $(USER_BINS), their man pages and completions;"
	@echo "the user unit $(UNITDIR)/shoald.service (systemctl --user enable --now shoald)"

install-dev: install
	$(call install_bins,$(DEV_BINS))

uninstall:
	rm -f $(foreach b,$(USER_BINS) $(DEV_BINS),$(DESTDIR)$(BINDIR)/$(b) \
	    $(DESTDIR)$(MANDIR)/man$(if $(filter shoald,$(b)),8,1)/$(call man_name,$(b)) \
	    $(DESTDIR)$(COMPDIR)/$(b))
	rm -f $(DESTDIR)$(UNITDIR)/shoald.service
	rm -rf $(DESTDIR)$(DOCDIR)

-include $(shell find $(BUILD) build-asan -name '*.d' 2>/dev/null)
