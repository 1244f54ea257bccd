// A QEMU TCG plugin that counts the instructions the guest executes between
// two marker instructions, user and kernel apart, per vCPU. Emulation speed,
// the guest's slow clock and other guests on the host do not change the count.
//
// Marker: nopl 0x4e4942XX(%rax), bytes 0f 1f 80 XX 42 49 4e. XX = 1 starts a
// region (zeroes the counters); any other XX ends it and appends to the out file
//   REGION <seq> tag <XX> user <n> kernel <n>
// (all vCPUs together: Soft-RoCE's work runs on either).
// and, with profile=on, one line per translation block that ran in it:
//   TB <seq> <vaddr hex> <instructions> <executions>
//
//   gcc -O2 -shared -fPIC -o icount-plugin.so plugin.c -lpthread
//   qemu-system-x86_64 -plugin icount-plugin.so,out=FILE[,profile=on] ...
//
// Written for QEMU 7.2 (plugin API version 1). No Debian 12 package ships
// qemu-plugin.h, so the few declarations used are copied below (they are the
// stable C ABI of that header).
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// --- from qemu-plugin.h (QEMU 7.2) ---------------------------------------
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;  // not read
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
#define EXPORT __attribute__((visibility("default")))
EXPORT int qemu_plugin_version = 1;
// --------------------------------------------------------------------------

#define KERNEL_START 0xffff800000000000ull  // x86-64: the upper half is the kernel's

// One per translated block (a block translated again gets another). `runs` is
// incremented by code QEMU inlines into the block (no callback per block: the
// guest runs about as fast as without the plugin); two vCPUs running the same
// block at the same instant may rarely lose an increment.
struct block {
  uint64_t vaddr;
  uint32_t insns;
  uint64_t runs;
  struct block *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static const char *out_path = "icount.log";
static bool profile;
static int regions;
// Blocks translated since the region began, user and kernel: QEMU translates a
// block again after a write to its page (JIT code, and data next to it), and
// each translation costs far more host time than running the block.
static uint64_t translations_user, translations_kernel;

static void region_start(void) {
  pthread_mutex_lock(&lock);
  for (struct block *b = blocks; b; b = b->next) b->runs = 0;
  translations_user = translations_kernel = 0;
  pthread_mutex_unlock(&lock);
}

static void region_end(unsigned int tag) {
  pthread_mutex_lock(&lock);
  uint64_t user = 0, kernel = 0;
  for (struct block *b = blocks; b; b = b->next) {
    if (b->vaddr >= KERNEL_START) kernel += b->runs * b->insns;
    else user += b->runs * b->insns;
  }
  int seq = ++regions;
  FILE *f = fopen(out_path, "a");
  if (f) {
    fprintf(f, "REGION %d tag %u user %" PRIu64 " kernel %" PRIu64 " tbs_user %" PRIu64 " tbs_kernel %" PRIu64 "\n", seq, tag, user,
            kernel, translations_user, translations_kernel);
    for (struct block *b = profile ? blocks : NULL; b; b = b->next) {
      if (b->runs) fprintf(f, "TB %d %" PRIx64 " %u %" PRIu64 "\n", seq, b->vaddr, b->insns, b->runs);
    }
    fclose(f);
  }
  pthread_mutex_unlock(&lock);
}

static void marker(unsigned int vcpu, void *udata) {
  (void)vcpu;
  unsigned int id = (unsigned int)(uintptr_t)udata;
  if (id == 1) region_start();
  else region_end(id);
}

static bool is_marker(const uint8_t *b, size_t size) {
  return size == 7 && b[0] == 0x0f && b[1] == 0x1f && b[2] == 0x80 && b[4] == 0x42 && b[5] == 0x49 && b[6] == 0x4e;
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  struct block *b = calloc(1, sizeof *b);
  if (!b) return;
  b->vaddr = qemu_plugin_tb_vaddr(tb);
  b->insns = (uint32_t)qemu_plugin_tb_n_insns(tb);
  pthread_mutex_lock(&lock);
  b->next = blocks;
  blocks = b;
  if (b->vaddr >= KERNEL_START) translations_kernel++;
  else translations_user++;
  pthread_mutex_unlock(&lock);
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->runs, 1);
  if (b->vaddr >= KERNEL_START) return;  // markers are placed in user space only
  for (size_t i = 0; i < b->insns; i++) {
    struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
    const uint8_t *bytes = qemu_plugin_insn_data(insn);
    if (is_marker(bytes, qemu_plugin_insn_size(insn))) {
      qemu_plugin_register_vcpu_insn_exec_cb(insn, marker, QEMU_PLUGIN_CB_NO_REGS, (void *)(uintptr_t)bytes[3]);
    }
  }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
  (void)info;
  for (int i = 0; i < argc; i++) {
    if (!strncmp(argv[i], "out=", 4)) out_path = argv[i] + 4;
    else if (!strcmp(argv[i], "profile=on")) profile = true;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
  return 0;
}
