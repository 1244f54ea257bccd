// The marker instructions that bench/icount/plugin.c counts between:
// nopl 0x4e4942XX(%rax), a no-op for the CPU. XX = 1 starts a region, XX = 2
// ends it (the plugin records the tag XX; only 1 and 2 are used here).
#pragma once

static inline void icount_mark(int id) {
  if (id == 1) __asm__ __volatile__(".byte 0x0f,0x1f,0x80,0x01,0x42,0x49,0x4e" ::: "memory");
  else __asm__ __volatile__(".byte 0x0f,0x1f,0x80,0x02,0x42,0x49,0x4e" ::: "memory");
}
