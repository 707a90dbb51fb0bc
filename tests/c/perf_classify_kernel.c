/* A kernel with a known instruction mix, for tests/test_perf.py: the counting plugin must
 * report exactly these classes, EMUL histograms and vector-memory bytes/elements/beats.
 * Called with a0 = a 64-byte aligned buffer of at least 128 bytes. */
void tk_kernel(void *buf);

__asm__(".text\n"
        ".globl tk_kernel\n"
        ".type tk_kernel, @function\n"
        ".p2align 2\n"
        "tk_kernel:\n"
        ".option push\n"
        ".option norvc\n"
        "vsetvli t0, zero, e8, m1, ta, ma\n"   /* vset */
        "vle8.v v2, (a0)\n"                    /* vload 32 B, 32 elements, 2 beats */
        "vle8.v v10, (a0)\n"                   /* vload 32 B */
        "vmv.v.i v16, 0\n"                     /* valu, EMUL 1 */
        "vmv.v.i v17, 0\n"                     /* valu, EMUL 1 */
        ".word 0xe225382b\n"                   /* vmadot v16, v10, v2 (traps into the emulator) */
        "vsetvli t0, zero, e32, m4, ta, ma\n"  /* vset */
        "vfmacc.vv v4, v8, v12\n"              /* vfpu, EMUL 4 */
        "vse32.v v4, (a0)\n"                   /* vstore 128 B, 32 elements, 8 beats */
        "vsetvli t0, zero, e16, m2, ta, ma\n"  /* vset */
        "vwadd.vv v8, v4, v6\n"                /* valu, widening: EMUL 4 */
        "vsetivli t0, 4, e32, m1, ta, ma\n"    /* vset, vl = 4 */
        "vle32.v v1, (a0)\n"                   /* vload 16 B, 4 elements, 1 beat */
        "addi t1, zero, 8\n"                   /* int */
        "vlse32.v v2, (a0), t1\n"              /* strided: 4 elements, 16 B */
        "vsetvl t0, t1, t1\n"                  /* vset from a register: vtype unknown to the plugin */
        "vadd.vv v1, v1, v1\n"                 /* valu, LMUL assumed 1 */
        "addi a1, a1, 1\n"                     /* int */
        "ld a2, 0(a0)\n"                       /* mem */
        "fadd.s ft0, ft0, ft0\n"               /* fp */
        "fdiv.s ft1, ft0, ft0\n"               /* div */
        "beqz zero, 1f\n"                      /* branch */
        "1:\n"
        ".option rvc\n"
        "c.addi a1, 1\n"                       /* int (16-bit) */
        "c.ld a3, 0(a0)\n"                     /* mem (16-bit) */
        ".option norvc\n"
        "vsetvli t0, zero, e8, m1, ta, ma\n"   /* vset */
        ".option rvc\n"
        "c.jr ra\n"                            /* branch (16-bit) */
        ".option pop\n"
        ".size tk_kernel, .-tk_kernel\n");
