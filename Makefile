# psd / ps-train build.
#
#   make            build build/bin/psd and build/bin/ps-train
#   make run        install deps, build, fetch data, psd + 2 trainers on loopback
#   make test       install deps, build, run every test (tests/run.sh)
#   make bench      performance table vs PyTorch (bench/run.sh, ~8 min)
#   make asan       same build with AddressSanitizer+UBSan under build-asan/
#   make install PREFIX=/usr/local DESTDIR=
#
# Sources are picked up by directory: common/ and common/nn/ form libps.a,
# server/ makes psd, trainer/ makes ps-train, tests/test_*.c one program each.

PREFIX  ?= /usr/local
DESTDIR ?=
BUILD   ?= build
CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN    := -Wall -Wextra -Wstrict-prototypes -Wno-missing-field-initializers
CPPFLAGS += -Icommon -Icommon/nn -Iserver -I$(BUILD)/proto -D_GNU_SOURCE -MMD -MP
LDLIBS  := -lgrpc -lgpr -ldnnl -lgomp -lyaml -lz -l:libprotobuf-nanopb.a -lpthread -lm
PS_VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
CPPFLAGS += -DPS_VERSION=\"$(PS_VERSION)\"

PROTO_C  := $(BUILD)/proto/ps.pb.c
PROTO_H  := $(BUILD)/proto/ps.pb.h
LIB_SRC  := $(wildcard common/*.c common/nn/*.c)
LIB_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC)) $(BUILD)/obj/proto/ps.pb.o
LIB      := $(BUILD)/libps.a
SRV_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out server/psd.c,$(wildcard server/*.c)))
SRV_LIB  := $(BUILD)/libpsd.a
PSD_OBJ  := $(BUILD)/obj/server/psd.o
TRN_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard trainer/*.c))
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BINS     := $(BUILD)/bin/psd $(BUILD)/bin/ps-train
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all deps data run test unit asan install clean bench
all: $(BINS) $(TEST_BIN) $(BENCH_BIN)

deps:
	@scripts/install-deps.sh

data: deps
	@scripts/fetch-mnist.sh data/mnist

run: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@scripts/run-local.sh

test: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) tests/run.sh

unit: all
	@BUILD=$(BUILD) tests/run.sh --unit

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    LDFLAGS="-fsanitize=address,undefined" all

$(PROTO_C) $(PROTO_H): proto/ps.proto proto/ps.options
	@mkdir -p $(BUILD)/proto
	cd proto && nanopb_generator.py -q -D ../$(BUILD)/proto -f ps.options ps.proto

$(BUILD)/obj/proto/ps.pb.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The dnnl backend's elementwise loops are OpenMP (libgomp, as oneDNN's runtime).
$(BUILD)/obj/common/nn/backend_dnnl.o: CFLAGS += -fopenmp

$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SRV_LIB): $(SRV_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/psd: $(PSD_OBJ) $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/ps-train: $(TRN_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Performance: compute, end to end, and PyTorch's tutorial on the same data
# (bench/run.sh; installs python3-torch for the PyTorch side). See README.
bench: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bench/run.sh

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

install: $(BINS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/psd/configs
	install -m 0755 $(BUILD)/bin/psd $(BUILD)/bin/ps-train $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 configs/*.yaml $(DESTDIR)$(PREFIX)/share/psd/configs/

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
