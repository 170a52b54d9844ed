# psd / ps-train build.
#
#   make            build build/bin/psd, build/bin/ps-train and build/bin/ps-ckpt
#   make run        install deps, build, fetch data, psd + 2 trainers on loopback
#   make run-rl     psd + 2 CartPole observers: the tutorial's REINFORCE agent until solved
#   make run-lm     the language model: fortunes corpus, psd (rnn_lm) + 2 ps-train lm, one epoch
#   make test-rl    the REINFORCE agent solves CartPole on >= 3 of 5 seeds (~10-20 min)
#   make test-fit   the small ResNet on Fashion-MNIST through psd (sync) + 2 `ps-train fit` vs PyTorch's loop (golden file; ~3 min)
#   make test-zoo   which torchvision models psd-export and ONNX import take (tests/export/zoo.py, ~3 min;
#                   ZOO_MODELS="resnet18 mobilenet_v2" for some)
#   make test       install deps, build, run every test (tests/run.sh)
#   make bench      performance table vs PyTorch, per ISA (bench/run.sh, ~11 min + ~5 building df35b72 for the
#                   pre-executor comparison, SKIP_BASE=1 without; QUICK=1 ~5)
#   make bench-lm   the language model's tokens/s, both decoder modes, vs the PyTorch RPC tutorial's
#                   design and local loop, the FMA peak, and test perplexity vs PyTorch over 3 seeds (~18 min)
#   make bench-cluster  MNIST and the LM on 1, 2 and 3 psd servers: rate, bytes per link, CPU-s per server
#   make bench-trainers psd's CPU per sample and call latency at 1, 2, 4, 8, 16 trainers (bench/trainers.sh)
#   make bench-batching 8 trainers with batching off / Forwards / Forwards+Backwards (bench/batching.sh)
#   make asan       same build with AddressSanitizer+UBSan under build-asan/
#   make fuzz       every libFuzzer target, FUZZ_SECONDS each (60): the RPC table, the config, safetensors,
#                   fit's data loaders (IDX, .npy, .npz), the model-file loader, the ONNX import
#   make test-hostile it_hostile with the issue-23 attacks (stalls from 4 clients, reset over 300 connections) 60 s each
#   make test-faults  fault tests incl. network namespaces (root): one psd, and a 2-server cluster
#   make test-load  16 concurrent trainers for LOAD_SECONDS (default 180)
#   make test-slurm scripts/slurm/ps-cluster.sbatch on a real 2-node Slurm this test starts (slurm-wlm)
#   make test-python  the Python package's long runs: 2 Python MNIST trainers, the Python RNN trainer
#                   against ps-train lm's perplexity, the REINFORCE example solving CartPole (~15-25 min)
#   make install PREFIX=/usr/local DESTDIR=   (binaries, psd-export, configs, systemd unit, docs, the psd Python package)
#
# Sources are picked up by directory (docs/layout.md): common/ and common/nn/
# (what both sides use) form libps.a, server/ and server/nn/ make psd, trainer/ makes
# ps-train, tests/test_*.c one program each.
# python/psd is the Python package (docs/python.md); `make` generates its
# gRPC stubs from proto/ps.proto into python/psd/_proto (git-ignored).

PREFIX  ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
DOCDIR  ?= $(PREFIX)/share/doc/psd
BUILD   ?= build
# A build directory made with flags of its own (make asan, make fuzz) keeps
# them in $(BUILD)/build.mk: a later `make BUILD=build-asan ...` (the suite's
# it_install runs `make install`) builds with the same flags and CUDA choice
# instead of mixing objects. Flags on the command line still win.
-include $(BUILD)/build.mk
CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN    := -Wall -Wextra -Wstrict-prototypes -Wno-missing-field-initializers
CPPFLAGS += -Icommon -Icommon/nn -Iserver -Iserver/nn -Itrainer -I$(BUILD)/proto -D_GNU_SOURCE -MMD -MP
LDLIBS  := -lgrpc -lgpr -ldnnl -lgomp -lyaml -lz -l:libprotobuf-nanopb.a -lpthread -lm
# psd: metrics endpoint (libmicrohttpd) and systemd readiness (sd_notify).
LDLIBS  += -lmicrohttpd -lsystemd
PS_VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
CPPFLAGS += -DPS_VERSION=\"$(PS_VERSION)\"

# CUDA backend (docs/gpu.md): compiled and linked in whenever nvcc
# is found (on PATH or /usr/local/cuda/bin); `make NVCC=` builds without it.
# The backend needs cuDNN 9 and cuBLAS next to the toolkit. CUDA_ARCH: SASS
# for Hopper (sm_90) plus PTX that newer GPUs and sm_75+ JIT-compile.
ifeq ($(origin NVCC),undefined)
NVCC := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
endif
NVCC_CCBIN ?= gcc
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75
ifneq ($(NVCC),)
CUDA_HOME ?= $(abspath $(dir $(shell command -v $(NVCC)))/..)
CUDA_LIB  ?= $(firstword $(wildcard $(CUDA_HOME)/lib64) $(CUDA_HOME)/lib)
ifeq ($(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h),)
$(error nvcc found ($(NVCC)) but no cudnn.h in $(CUDA_HOME)/include or /usr/include: install cuDNN 9, or build without CUDA with `make NVCC=`)
endif
NVCCFLAGS ?= -O2 -g -std=c++17 -ccbin $(NVCC_CCBIN) $(CUDA_ARCH) -Xcompiler -Wall,-Wextra
CPPFLAGS  += -DPS_HAVE_CUDA -I$(CUDA_HOME)/include
LIB_CUDA  := $(BUILD)/obj/common/nn/backend_cuda.o $(BUILD)/obj/common/nn/backend_cuda_kernels.o
# cuBLAS is not linked: backend_cuda.c opens it on first use (its libcublasLt
# costs ~0.5 s of CPU at every start of a program linking it).
LDLIBS    += -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcudnn -lcudart -lstdc++
endif
# backend.c registers the CUDA backend or not: rebuild it when that changes.
CUDA_STAMP := $(BUILD)/cuda-config
CUDA_STATE := $(if $(NVCC),$(NVCC) $(CUDA_HOME),none)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(CUDA_STAMP) 2>/dev/null)" = "$(CUDA_STATE)" ] || echo "$(CUDA_STATE)" > $(CUDA_STAMP))

PROTOS   := ps health onnx
PROTO_C  := $(patsubst %,$(BUILD)/proto/%.pb.c,$(PROTOS))
PROTO_H  := $(patsubst %,$(BUILD)/proto/%.pb.h,$(PROTOS))
CUDA_SRC := common/nn/backend_cuda.c common/nn/backend_cuda_kernels.cu
LIB_SRC  := $(filter-out $(CUDA_SRC),$(wildcard common/*.c common/nn/*.c))
LIB_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC)) $(patsubst %,$(BUILD)/obj/proto/%.pb.o,$(PROTOS)) $(LIB_CUDA)
LIB      := $(BUILD)/libps.a
SRV_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out server/psd.c,$(wildcard server/*.c server/nn/*.c)))
# The dashboard's page (web/) and chart library, compiled into psd (below).
SRV_OBJ  += $(BUILD)/obj/web/web_assets.o
SRV_LIB  := $(BUILD)/libpsd.a
PSD_OBJ  := $(BUILD)/obj/server/psd.o
# trainer/ except main() is libtrainer.a, so unit tests link its modules.
TRN_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out trainer/ps_train.c,$(wildcard trainer/*.c)))
TRN_LIB  := $(BUILD)/libtrainer.a
TRN_MAIN := $(BUILD)/obj/trainer/ps_train.o
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
# Shared test code (the check counters, the golden replay), linked into every test.
TEST_SUPPORT_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/*.c))
BINS     := $(BUILD)/bin/psd $(BUILD)/bin/ps-train $(BUILD)/bin/ps-ckpt
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
# The Python package: Debian's python3 (with python3-grpc-tools, python3-grpcio, python3-torch).
PYTHON   ?= /usr/bin/python3
PY_GEN_DIR := python/psd/_proto
PY_GEN   := $(PY_GEN_DIR)/__init__.py $(PY_GEN_DIR)/ps_pb2.py $(PY_GEN_DIR)/ps_pb2_grpc.py
# Where Debian's python3 finds packages under PREFIX (/usr/local/lib/python3.N/dist-packages).
PYTHONDIR ?= $(PREFIX)/lib/python3.$(shell $(PYTHON) -c 'import sys; print(sys.version_info[1])' 2>/dev/null || echo 11)/dist-packages

# Quiet build: one short line per step ("CC common/wire.c", "LD build/bin/psd");
# `make V=1` prints the full commands.
ifeq ($(V),1)
Q :=
say :=
else
Q := @
say = @printf '  %-6s %s\n' $(1) $(2);
endif

.PHONY: all deps data run run-rl run-lm test test-rl test-python test-fit test-zoo unit asan install clean fuzz test-hostile test-faults test-load test-slurm bench bench-lm bench-cluster bench-trainers bench-batching
all: $(BINS) $(TEST_BIN) $(BENCH_BIN) $(PY_GEN)

deps:
	@scripts/install-deps.sh

data: deps
	@scripts/fetch-mnist.sh data/mnist

run: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-mnist.sh data/mnist
	@scripts/run-local.sh

run-lm: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-fortunes.sh data/fortunes
	@scripts/run-lm.sh

run-rl: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/run-rl.sh

RL_SEEDS ?= 1 2 3 4 5
test-rl: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@BUILD=$(BUILD) RL_SEEDS="$(RL_SEEDS)" bash tests/rl/solve.sh

# docs/fit.md: psd + 2 ps-train fit trainers within 1 point of PyTorch's
# local loop (mean of FIT_SEEDS), the checkpoint loaded into the twin.
FIT_SEEDS ?= 1 2
test-fit: deps
	@scripts/install-deps.sh --fit
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) FIT_SEEDS="$(FIT_SEEDS)" bash tests/fit/small_resnet.sh

# docs/testing.md: torchvision's classification models through psd-export and
# the ONNX training export to psd --check-config, one line per model and path;
# then mobilenet_v3_small (Hardswish, Hardsigmoid, squeeze-and-excitation's
# Mul), regnet_x_400mf ('-' in its names), regnet_y_400mf (Sigmoid-gated
# Mul), mnasnet0_5 (x.mean([2, 3])), squeezenet1_1 and googlenet (ceil_mode
# pools), convnext_tiny (Permute, LayerNorm and Linear on the last dim, the
# layer scale; stochastic depth off), densenet121 (Concats of up to 25) and
# shufflenet_v2_x0_5 (chunk, channel shuffle) trained one step through psd
# both ways against PyTorch (~4 min).
ZOO_MODELS ?=
test-zoo: deps
	@$(MAKE) --no-print-directory all
	@d=$$(mktemp -d) && /usr/bin/python3 tests/export/zoo.py $(BUILD) $$d $(ZOO_MODELS) && \
	  /usr/bin/python3 tests/export/check_resnet.py $(BUILD) $$d mobilenet_v3_small regnet_x_400mf regnet_y_400mf \
	    mnasnet0_5 squeezenet1_1 googlenet alexnet efficientnet_b0 efficientnet_v2_s convnext_tiny \
	    densenet121 shufflenet_v2_x0_5 vit_small swin_small; \
	  rc=$$?; rm -rf $$d; exit $$rc

# make test builds on every core unless the command line says how (-j N):
# CI runs a plain `make test` on a fresh clone.
JOBS_DEFAULT = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2))
test: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) $(JOBS_DEFAULT) all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) tests/run.sh

unit: all
	@BUILD=$(BUILD) tests/run.sh --unit

comma := ,
# build_mk DIR, then lines: DIR/build.mk (above), rewritten only when it changes
build_mk = mkdir -p $(1) && printf '%s\n' $(2) >$(1)/build.mk.new && \
    { cmp -s $(1)/build.mk.new $(1)/build.mk && rm $(1)/build.mk.new || mv $(1)/build.mk.new $(1)/build.mk; }
asan:
	@$(call build_mk,build-asan,'OPT := -O1 -fsanitize=address$(comma)undefined -fno-omit-frame-pointer' \
	    'LDFLAGS := -fsanitize=address$(comma)undefined' 'NVCC := $(NVCC)')
	@$(MAKE) --no-print-directory BUILD=build-asan all

FUZZ_SECONDS ?= 60
FUZZ_BIN := $(patsubst tests/fuzz/%.c,build-fuzz/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz:
	@scripts/install-deps.sh --fuzz
	@$(call build_mk,build-fuzz,'CC := clang-14' 'NVCC :=' \
	    'OPT := -O1 -fsanitize=fuzzer-no-link$(comma)address$(comma)undefined -fno-omit-frame-pointer' \
	    'LDFLAGS := -fsanitize=address$(comma)undefined')
	@$(MAKE) --no-print-directory BUILD=build-fuzz $(FUZZ_BIN)
	@BUILD=build-fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh

$(BUILD)/fuzz/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(TRN_LIB) $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) -fsanitize=fuzzer $(CFLAGS) -o $@ $^ $(LDLIBS)

# it_hostile with the issue-23 attacks (stalls from 4 addresses or 4 reader
# tokens, rapid reset over 300 connections) run 60 s instead of 10 s
test-hostile: all
	@HOSTILE_SECONDS=60 BUILD=$(BUILD) bash tests/it_hostile.sh

test-faults: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bash tests/faults/netns_link_cut.sh
	@BUILD=$(BUILD) bash tests/faults/netns_cluster.sh

# The Python package's long runs (tests/python/run.sh; the quick ones are in `make test`).
test-python: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@scripts/fetch-fortunes.sh data/fortunes
	@BUILD=$(BUILD) bash tests/python/run.sh

LOAD_SECONDS ?= 180
test-load: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) LOAD_SECONDS=$(LOAD_SECONDS) bash tests/load/load16.sh

# A real Slurm (slurmctld + slurmd n1, n2 on this host, from a temp dir) runs
# 2 psd + 2 trainers as one heterogeneous job (tests/slurm/run.sh).
test-slurm: deps
	@scripts/install-deps.sh --slurm
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bash tests/slurm/run.sh


# Generated sources and test objects are kept (not deleted as intermediates,
# which made every `make` rebuild the tests).
.SECONDARY: $(PROTO_C) $(PROTO_H) $(patsubst tests/%.c,$(BUILD)/obj/tests/%.o,$(TEST_SRC)) $(TEST_SUPPORT_OBJ)
$(BUILD)/proto/%.pb.c $(BUILD)/proto/%.pb.h: proto/%.proto proto/%.options
	@mkdir -p $(BUILD)/proto
	$(call say,GEN,$@)cd proto && nanopb_generator.py -q -D ../$(BUILD)/proto -f $*.options $*.proto

# ONNX models (common/nn/onnx.c): nanopb sources generated from Debian
# libonnx-dev's onnx.proto with proto/onnx.options.
ONNX_PROTO ?= /usr/include/onnx/onnx.proto
$(BUILD)/proto/onnx.pb.c $(BUILD)/proto/onnx.pb.h &: $(wildcard $(ONNX_PROTO)) proto/onnx.options
	@[ -f $(ONNX_PROTO) ] || { echo "make: $(ONNX_PROTO) is missing: scripts/install-deps.sh installs libonnx-dev" >&2; exit 1; }
	@mkdir -p $(BUILD)/proto
	$(call say,GEN,$@)cp $(ONNX_PROTO) $(BUILD)/proto/onnx.proto && cd $(BUILD)/proto && \
	    nanopb_generator.py -q -f $(abspath proto/onnx.options) onnx.proto

# The Python stubs (python3-grpc-tools). ps_pb2_grpc imports ps_pb2 as a
# top-level module; inside the package it is a sibling.
$(PY_GEN_DIR)/ps_pb2.py $(PY_GEN_DIR)/ps_pb2_grpc.py: proto/ps.proto
	@mkdir -p $(PY_GEN_DIR)
	@$(PYTHON) -c 'import grpc_tools' 2>/dev/null || { echo "make: python3-grpc-tools is missing (scripts/install-deps.sh): it generates python/psd's stubs" >&2; exit 1; }
	$(call say,GEN,$(PY_GEN_DIR))$(PYTHON) -m grpc_tools.protoc -Iproto --python_out=$(PY_GEN_DIR) --grpc_python_out=$(PY_GEN_DIR) proto/ps.proto
	$(Q)sed -i 's/^import ps_pb2 as /from . import ps_pb2 as /' $(PY_GEN_DIR)/ps_pb2_grpc.py

$(PY_GEN_DIR)/__init__.py: VERSION
	@mkdir -p $(PY_GEN_DIR)
	$(Q)printf '"""Generated by make (python3-grpc-tools stubs of proto/ps.proto); not in git."""\nversion = "%s"\n' "$(PS_VERSION)" > $@

$(BUILD)/obj/proto/%.pb.o: $(BUILD)/proto/%.pb.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The dnnl backend's elementwise loops are OpenMP (libgomp, as oneDNN's runtime).
# GNU OpenMP, the runtime Debian's oneDNN uses (clang defaults to LLVM's libomp).
OPENMP_CFLAGS := $(if $(findstring clang,$(CC)),-fopenmp=libgomp,-fopenmp)
$(BUILD)/obj/common/nn/backend_dnnl.o $(BUILD)/obj/trainer/lstm.o: CFLAGS += $(OPENMP_CFLAGS)
# The LSTM cell's clamps vectorise only when comparisons may not trap (NaN still propagates).
$(BUILD)/obj/trainer/lstm.o: CFLAGS += -fno-trapping-math

$(BUILD)/obj/%.o: %.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -Icommon -Icommon/nn -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/obj/common/nn/backend.o: $(CUDA_STAMP)

# model.arch NAME is looked up beside the binary first (modeldef.h); the
# install directory compiled in is the last resort.
$(BUILD)/obj/common/nn/modeldef.o: CPPFLAGS += -DPS_MODELS_DIR=\"$(PREFIX)/share/psd/models\"

# psd's web dashboard (server/dashboard.c): web/ and the chart library uPlot
# from the npm registry, pinned by web/package-lock.json and installed by
# `npm ci` into web/node_modules when it is missing or older than the lock
# file (no network once it is there), compiled into psd with its licence
# by scripts/embed-web.py. Nothing is fetched when the page runs.
WEB_LIB   := web/node_modules/uplot/dist/uPlot.iife.min.js
WEB_FILES := /=web/index.html /dashboard.js=web/dashboard.js /dashboard.css=web/dashboard.css /favicon.svg=web/favicon.svg \
             /uPlot.iife.min.js=$(WEB_LIB) /uPlot.min.css=web/node_modules/uplot/dist/uPlot.min.css \
             /uPlot.LICENSE.txt=web/node_modules/uplot/LICENSE
$(WEB_LIB): web/package.json web/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "web/node_modules is missing and npm is not installed: run scripts/install-deps.sh (or make deps)" >&2; exit 1; }
	$(call say,NPM,web/node_modules)cd web && npm ci --no-audit --no-fund --loglevel=error $(if $(Q),>/dev/null)
	@touch $@

$(BUILD)/web/web_assets.c: scripts/embed-web.py web/index.html web/dashboard.js web/dashboard.css web/favicon.svg $(WEB_LIB)
	$(call say,GEN,$@)/usr/bin/env python3 scripts/embed-web.py -o $@ $(WEB_FILES)

$(BUILD)/obj/web/web_assets.o: $(BUILD)/web/web_assets.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) -Iserver $(CFLAGS) $(WARN) -c $< -o $@

# An archive is made again when its list of members changes (a source moved
# to another directory or removed), not only when a member is newer: a stale
# member left in an archive could still be linked.
members = $(shell [ "$$(cat $(1) 2>/dev/null)" = "$(2)" ] || echo "$(2)" > $(1))$(1)
LIB_MEMBERS := $(call members,$(BUILD)/libps.members,$(LIB_OBJ))
SRV_MEMBERS := $(call members,$(BUILD)/libpsd.members,$(SRV_OBJ))
TRN_MEMBERS := $(call members,$(BUILD)/libtrainer.members,$(TRN_OBJ))

$(LIB): $(LIB_OBJ) $(LIB_MEMBERS)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $(filter %.o,$^)

$(SRV_LIB): $(SRV_OBJ) $(SRV_MEMBERS)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $(filter %.o,$^)

$(BUILD)/bin/psd: $(PSD_OBJ) $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(TRN_LIB): $(TRN_OBJ) $(TRN_MEMBERS)
	@rm -f $@
	$(call say,AR,$@)ar rcs $@ $(filter %.o,$^)

$(BUILD)/bin/ps-train: $(TRN_MAIN) $(TRN_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

# ps-ckpt: checkpoint parts of a cluster (merge, info); tools/ps_ckpt.c.
$(BUILD)/bin/ps-ckpt: $(BUILD)/obj/tools/ps_ckpt.o $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT_OBJ) $(TRN_LIB) $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Performance: compute, end to end, and PyTorch's tutorial on the same data
# (bench/run.sh; installs python3-torch for the PyTorch side). See docs/performance.md.
bench: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bench/run.sh
# psd's CPU per sample and call latency at 1, 2, 4, 8, 16 trainers (also part of make bench).
bench-trainers: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bench/trainers.sh
# The same with batched training calls off, Forwards only, Forwards and Backwards, alternately
# (server.batch_wait_ms, server.batch_backward; 8 trainers; for information on CPU).
bench-batching: deps
	@$(MAKE) --no-print-directory all
	@scripts/fetch-mnist.sh data/mnist
	@BUILD=$(BUILD) bench/batching.sh

# The language model's throughput, both decoder modes, 1 and 2 trainers,
# beside the PyTorch RPC tutorial's design and PyTorch's local loop at the
# same sizes, the CPU's FMA peak and the targets' ratios (~5 min), then test
# perplexity vs PyTorch's RNNModel over 3 seeds (LM_STEPS=100 windows each,
# ~15 min; LM_QUALITY=0 skips it). bench/lm.sh says more.
bench-lm: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@BUILD=$(BUILD) bench/lm.sh

# One model on 1, 2 and 3 psd servers on loopback: samples or tokens/s,
# bytes per batch on each link, CPU-seconds per server per batch (~3 min).
bench-cluster: deps
	@$(MAKE) --no-print-directory $(if $(Q),-s) all
	@BUILD=$(BUILD) bench/cluster.sh

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(TRN_LIB) $(SRV_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

install: $(BINS) $(PY_GEN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/psd/configs $(DESTDIR)$(PREFIX)/share/psd/models
	install -m 0755 $(BUILD)/bin/psd $(BUILD)/bin/ps-train $(BUILD)/bin/ps-ckpt $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 tools/psd-export $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 configs/*.yaml $(DESTDIR)$(PREFIX)/share/psd/configs/
	install -m 0644 configs/models/*.yaml $(DESTDIR)$(PREFIX)/share/psd/models/
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(DOCDIR)
	sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    systemd/psd.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/psd.service
	chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/psd.service
	sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	    -f systemd/psd-template.sed systemd/psd.service.in > $(DESTDIR)$(SYSTEMDUNITDIR)/psd@.service
	chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/psd@.service
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/docs/img
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/
	install -m 0644 docs/img/*.png $(DESTDIR)$(DOCDIR)/docs/img/
	install -d $(DESTDIR)$(PYTHONDIR)/psd/_proto $(DESTDIR)$(DOCDIR)/examples
	install -m 0644 python/psd/*.py $(DESTDIR)$(PYTHONDIR)/psd/
	install -m 0644 $(PY_GEN) $(DESTDIR)$(PYTHONDIR)/psd/_proto/
	install -m 0644 examples/*.py $(DESTDIR)$(DOCDIR)/examples/

clean:
	rm -rf build build-asan build-fuzz $(PY_GEN_DIR) python/psd/__pycache__

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
