# `make check-neon`: the SIMD kernels against the scalar ones, with tests/check_kernels.c
# (quant kernels) and ../tests/reference/check_attention.c (attention with windows and
# sinks, SwiGLU, GeGLU).
#  - NEON: kernel sources cross-compiled for aarch64 (static) and run under qemu-user;
#    skipped, with a line saying so, when the cross compiler or qemu is missing (in CI,
#    CI=true, that is an error: `make test-tools` installs them).
#  - this machine's own SIMD sets (AVX2 and, where the CPU has it, AVX-512 on x86-64): the
#    same programs against libds4n.so and the library's attention objects.

AARCH64_CC   ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64
KERNEL_SRCS  := quants.c quants_int.c simd.c threadpool.c matmul.c profile.c macpeak.c
NEON_SRCS    := quants_neon.c matmul_neon.c quants_int_neon.c macpeak_neon.c
# with their own flags (Makefile): the SDOT kernels
DOTPROD_SRCS := quants_int_neon_dotprod.c macpeak_neon_dotprod.c
DOTPROD_FLAGS := -march=armv8.2-a+dotprod
# The kernels under two CPUs: qemu's `max` (SDOT, i8mm: the neon+dotprod integer kernels),
# everything; then a Cortex-A53 (Armv8.0, no SDOT: the baseline NEON integer kernels), the
# integer path's block-format types only (the kernels that differ by CPU).
QEMU_CPU2    ?= cortex-a53
CHECK_SRC    := tests/check_kernels.c
ATTN_CHECK   := ../tests/reference/check_attention.c
CHECK_CFLAGS := -O2 -std=c11 -Wall -Wextra -Wno-unused-parameter -Werror -pthread -D_GNU_SOURCE -I. -I$(BUILD)
KERNEL_HDRS  := ds4n.h quants.h quants_int.h quants_neon.h quants_int_neon_block.h macpeak.h \
                macpeak_generic.h $(BUILD)/iq2xxs_tables.h $(BUILD)/nibble_tables.h

.PHONY: check-neon-native check-neon-cross
check-neon: check-neon-native check-neon-cross

check-neon-native: $(BUILD)/libds4n.so $(CHECK_SRC)
	$(CC) $(CHECK_CFLAGS) $(CHECK_SRC) -o $(BUILD)/check_kernels -L$(BUILD) -lds4n -Wl,-rpath,'$$ORIGIN' -lm
	$(BUILD)/check_kernels
	$(CC) $(CHECK_CFLAGS) attention.c $(filter $(BUILD)/attention_%,$(OBJS)) $(ATTN_CHECK) \
	  -o $(BUILD)/check_attention -lm
	$(BUILD)/check_attention

check-neon-cross: $(KERNEL_SRCS) $(NEON_SRCS) $(DOTPROD_SRCS) $(CHECK_SRC) $(KERNEL_HDRS)
	@if command -v $(AARCH64_CC) >/dev/null 2>&1 && command -v $(QEMU_AARCH64) >/dev/null 2>&1; then \
	  echo "$(AARCH64_CC) -static ... -o $(BUILD)/check_kernels_aarch64" && \
	  for f in $(DOTPROD_SRCS); do \
	    $(AARCH64_CC) $(CHECK_CFLAGS) $(DOTPROD_FLAGS) -c $$f -o $(BUILD)/check_$${f%.c}_aarch64.o \
	      || exit 1; \
	  done && \
	  $(AARCH64_CC) -static $(CHECK_CFLAGS) $(KERNEL_SRCS) $(NEON_SRCS) \
	    $(DOTPROD_SRCS:%.c=$(BUILD)/check_%_aarch64.o) $(CHECK_SRC) \
	    -o $(BUILD)/check_kernels_aarch64 -lm && \
	  echo "qemu-aarch64 -cpu max:" && $(QEMU_AARCH64) -cpu max $(BUILD)/check_kernels_aarch64 && \
	  echo "qemu-aarch64 -cpu $(QEMU_CPU2):" && \
	  $(QEMU_AARCH64) -cpu $(QEMU_CPU2) $(BUILD)/check_kernels_aarch64 int-block && \
	  $(AARCH64_CC) -static $(CHECK_CFLAGS) attention.c attention_neon.c $(ATTN_CHECK) \
	    -o $(BUILD)/check_attention_aarch64 -lm && \
	  $(QEMU_AARCH64) $(BUILD)/check_attention_aarch64; \
	elif [ "$${CI:-}" = true ]; then \
	  echo "check-neon: $(AARCH64_CC) and $(QEMU_AARCH64) missing in CI (run make test-tools)"; \
	  exit 1; \
	else \
	  echo "check-neon: skipped (needs $(AARCH64_CC) and $(QEMU_AARCH64))"; \
	fi
